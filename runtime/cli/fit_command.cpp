// `tierlm fit --model ID|DIR` — will a model run on this machine, with what plan and how fast, answered before any
// download: config.json and the safetensors headers (for a hub id: the model-info API and Range reads of each
// shard's header) give the model's shape and format; this machine's calibrated device profile (the wisdom file's,
// else quick probes, or --device FILE) gives the rates; the planner calibrate uses (calibrate/planner.h) makes the
// plan. Architectures tierlm cannot run are named as such.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "calibrate/planner.h"
#include "calibrate/probes.h"
#include "calibrate/wisdom.h"
#include "runtime/cli/commands.h"
#include "runtime/hub/remote_headers.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"

namespace tierlm::cli {

namespace {

namespace bj = boost::json;

struct FitOptions {
  std::string model;
  int64_t context = 4096;
  int64_t prompt_tokens = 512;
  double budget_gib = 0;
  std::string device;  // a device profile JSON instead of this machine's
  bool json = false;
};

struct ModelShape {
  std::string config_json;
  std::vector<std::string> dtypes;  // of the 2-D weights, from the safetensors headers
  uint64_t stored_bytes = 0;       // tensor bytes the headers declare
  uint64_t bytes_fetched = 0;      // hub ids: bytes received to learn all this
};

void add_header(ModelShape& shape, const std::string& header_json) {
  const bj::object header = bj::parse(header_json).as_object();
  for (const auto& [name, value] : header) {
    if (name == "__metadata__" || !value.is_object()) continue;
    const auto& tensor = value.as_object();
    const auto& offsets = tensor.at("data_offsets").as_array();
    shape.stored_bytes += uint64_t(offsets.at(1).to_number<int64_t>() - offsets.at(0).to_number<int64_t>());
    if (tensor.at("shape").as_array().size() == 2 && shape.dtypes.size() < 1)
      shape.dtypes.emplace_back(tensor.at("dtype").as_string());
  }
}

ModelShape read_shape(const std::string& model) {
  ModelShape shape;
  if (const auto id = hub::parse_hub_id(model)) {
    const hub::RemoteModel remote = hub::fetch_remote_model(*id);
    shape.config_json = remote.config_json;
    for (const auto& [file, header] : remote.shard_headers) add_header(shape, header);
    shape.bytes_fetched = remote.bytes_fetched;
    return shape;
  }
  std::ifstream in(std::filesystem::path(model) / "config.json");
  if (!in) throw std::runtime_error(model + ": no config.json (give a model folder or a hub id ORG/NAME)");
  shape.config_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  const model::TensorIndex index = model::TensorIndex::open(model);
  for (const auto& [name, t] : index.tensors()) {
    shape.stored_bytes += t.length;
    if (t.shape.size() == 2 && shape.dtypes.empty()) shape.dtypes.emplace_back(model::dtype_name(t.dtype));
  }
  return shape;
}

// The format the weights run in when loaded as stored (MLX quantization from config.json, else the dtype).
kernels::WeightFormat stored_format(const model::ModelConfig& config, const ModelShape& shape) {
  if (config.quantization) return config.quantization->bits == 8 ? kernels::WeightFormat::mlx_q8 : kernels::WeightFormat::mlx_q4;
  const std::string dtype = shape.dtypes.empty() ? config.torch_dtype : shape.dtypes.front();
  if (dtype == "BF16" || dtype == "bfloat16") return kernels::WeightFormat::bf16;
  if (dtype == "F16" || dtype == "float16") return kernels::WeightFormat::f16;
  return kernels::WeightFormat::f32;
}

calibrate::DeviceProfile device_for(const FitOptions& o, std::string& source) {
  if (!o.device.empty()) {
    source = "device profile " + o.device;
    return calibrate::load_device_profile(o.device);
  }
  const auto identity = calibrate::probe_device_identity(".");
  const auto path = calibrate::default_wisdom_path();
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    const calibrate::Wisdom wisdom = calibrate::load_wisdom(path);
    for (const auto& entry : wisdom.entries)
      if (entry.device.fingerprint() == identity.fingerprint()) {
        source = "this machine's calibration (" + path.string() + ", " + entry.created_at + ")";
        return entry.device;
      }
  }
  source = "quick probes of this machine (no calibration stored: `tierlm calibrate` measures it fully)";
  spdlog::info("fit: no calibration of this machine in {}; running quick probes", path.string());
  calibrate::ProbeOptions probe;
  probe.quick = true;
  return calibrate::probe_device(probe);
}

void fit(const FitOptions& o) {
  const ModelShape shape = read_shape(o.model);
  const bj::object raw = bj::parse(shape.config_json).as_object();
  const std::string model_type = raw.contains("model_type") ? std::string(raw.at("model_type").as_string()) : "";
  bj::object out{{"model", o.model}, {"model_type", model_type}, {"bytes_fetched", shape.bytes_fetched}};
  if (!model::find_architecture(model_type)) {
    std::string supported;
    for (const auto& a : model::supported_architectures()) supported += (supported.empty() ? "" : ", ") + a;
    out["supported"] = false;
    out["reason"] = "architecture '" + model_type + "' is not supported by tierlm yet (supported: " + supported + ")";
    if (o.json) std::puts(bj::serialize(out).c_str());
    else std::printf("%s: %s\n", o.model.c_str(), out["reason"].as_string().c_str());
    return;
  }
  const model::ModelConfig config = model::parse_config(shape.config_json, o.model + "/config.json");
  const kernels::WeightFormat format = stored_format(config, shape);
  calibrate::ModelProfile profile = calibrate::model_profile_from_config(config, format, format);
  profile.name = o.model;
  std::string device_source;
  const calibrate::DeviceProfile device = device_for(o, device_source);
  calibrate::PlanRequest request;
  request.budget_bytes = uint64_t(o.budget_gib * double(1ull << 30));
  request.context = std::min<int64_t>(o.context, config.max_position_embeddings);
  auto plan_at = [&](int64_t context) -> std::optional<calibrate::Plan> {
    calibrate::PlanRequest r = request;
    r.context = context;
    try {
      return calibrate::make_plan(device, profile, r);
    } catch (const calibrate::PlanError&) {
      return std::nullopt;
    }
  };
  // The largest context that fits: the planner's answer is monotone in context, so a binary search over it.
  int64_t low = 0, high = config.max_position_embeddings;
  while (low < high) {
    const int64_t mid = (low + high + 1) / 2;
    if (mid >= 16 && plan_at(mid)) low = mid; else high = mid - 1;
  }
  out["supported"] = true;
  out["weight_format"] = kernels::format_name(format);
  out["stored_bytes"] = shape.stored_bytes;
  out["device_source"] = device_source;
  out["largest_context"] = low;
  out["context"] = request.context;
  std::string reason;
  std::optional<calibrate::Plan> plan;
  try {
    plan = calibrate::make_plan(device, profile, request);
  } catch (const calibrate::PlanError& e) {
    reason = e.what();
  }
  out["fits"] = plan.has_value();
  if (!plan) out["reason"] = reason;
  double ttft = 0;
  if (plan) {
    const auto& p = plan->prediction;
    ttft = p.prefill_tokens_per_second > 0 ? double(std::min(o.prompt_tokens, request.context)) / p.prefill_tokens_per_second : 0;
    out["plan"] = calibrate::to_json(*plan);
    out["predicted"] = bj::object{{"decode_tokens_per_second", p.decode_tokens_per_second},
                                  {"prefill_tokens_per_second", p.prefill_tokens_per_second},
                                  {"time_to_first_token_seconds", ttft},
                                  {"prompt_tokens", std::min(o.prompt_tokens, request.context)},
                                  {"memory_bytes", p.total_memory()}};
  }
  if (o.json) {
    std::puts(bj::serialize(out).c_str());
    return;
  }
  std::printf("model %s: %s, %lld layers%s, %s, %.2f GB of weights stored\n", o.model.c_str(), model_type.c_str(),
              (long long)config.num_layers,
              config.num_experts ? (", " + std::to_string(config.num_experts) + " experts").c_str() : "",
              kernels::format_name(format), double(shape.stored_bytes) / 1e9);
  std::printf("rates from %s\n", device_source.c_str());
  if (!plan) {
    std::printf("does not fit at context %lld: %s\n", (long long)request.context, reason.c_str());
  } else {
    const auto& p = plan->prediction;
    std::printf("fits at context %lld in a %.2f GiB budget: %d threads, KV %s, %d GPU layers", (long long)request.context,
                double(plan->budget_bytes) / double(1ull << 30), plan->threads, plan->kv_codec.c_str(), plan->gpu_layers);
    if (profile.moe())
      std::printf(", %lld resident experts, %lld cache slots", (long long)plan->resident_count(), (long long)plan->cache_slots);
    std::printf("\npredicted: decode %.1f tok/s, prefill %.1f tok/s, time to first token %.2f s (%lld-token prompt), "
                "memory %.2f GiB\n", p.decode_tokens_per_second, p.prefill_tokens_per_second, ttft,
                (long long)std::min(o.prompt_tokens, request.context), double(p.total_memory()) / double(1ull << 30));
  }
  std::printf("largest context that fits: %lld tokens\n", (long long)low);
  if (shape.bytes_fetched) std::printf("read from the hub: %llu bytes (config.json and safetensors headers)\n",
                                       (unsigned long long)shape.bytes_fetched);
}

}  // namespace

void add_fit_command(CLI::App& app) {
  auto o = std::make_shared<FitOptions>();
  CLI::App* cmd = app.add_subcommand("fit", "Will a model run here, with what plan and how fast? (before any download)");
  cmd->add_option("--model,-m", o->model, "Model folder or Hugging Face id ORG/NAME[@REV]")->required();
  cmd->add_option("--context", o->context, "Target context (tokens per sequence)")->check(CLI::Range(int64_t(16), int64_t(1) << 22));
  cmd->add_option("--budget", o->budget_gib, "Memory budget in GiB (0: 85% of usable memory)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for the time to first token")->check(CLI::Range(int64_t(1), int64_t(1) << 22));
  cmd->add_option("--device", o->device, "A device profile JSON (profiles/devices/) instead of this machine");
  cmd->add_flag("--json", o->json, "Machine-readable JSON");
  cmd->callback([o] { fit(*o); });
}

}  // namespace tierlm::cli
