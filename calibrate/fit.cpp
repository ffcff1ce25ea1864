// calibrate/fit.cpp — fit_model: a shape -> profile -> the planner's plan at the asked context, and the largest
// context that fits (calibrate/fit.h).
#include "calibrate/fit.h"

#include <algorithm>

#include <boost/json.hpp>

#include "calibrate/probe_limits.h"
#include "calibrate/probes.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"

namespace tierlm::calibrate {

namespace bj = boost::json;

kernels::WeightFormat stored_weight_format(const model::ModelConfig& config, const FitModelShape& shape) {
  if (config.quantization) {
    // Most dense modules' format: an MLX gpt-oss folder keeps only its experts in the top level's mxfp4.
    const model::QuantizationConfig::Module dense = config.quantization->dense();
    if (dense.mxfp4) return kernels::WeightFormat::mxfp4;
    return dense.bits == 8 ? kernels::WeightFormat::mlx_q8 : kernels::WeightFormat::mlx_q4;
  }
  const std::string dtype = shape.matrix_dtype.empty() ? config.torch_dtype : shape.matrix_dtype;
  if (dtype == "BF16" || dtype == "bfloat16") return kernels::WeightFormat::bf16;
  if (dtype == "F16" || dtype == "float16") return kernels::WeightFormat::f16;
  return kernels::WeightFormat::f32;
}

FitAnswer fit_model(const FitModelShape& shape, const DeviceProfile& device, const FitRequest& request) {
  FitAnswer a;
  const bj::object raw = bj::parse(shape.config_json).as_object();
  if (const auto* t = raw.if_contains("model_type"); t && t->is_string()) a.model_type = std::string(t->as_string());
  if (!model::find_architecture(a.model_type)) {
    std::string supported;
    for (const auto& name : model::supported_architectures()) supported += (supported.empty() ? "" : ", ") + name;
    a.reason = "architecture '" + a.model_type + "' is not supported by tierlm yet (supported: " + supported + ")";
    return a;
  }
  // A family tierlm runs whose checkpoint carries an option it does not (DeepSeek-V3's YaRN rope or FP8 blocks):
  // named as unsupported with the option, like an unknown family.
  model::ModelConfig config;
  try {
    config = model::parse_config(shape.config_json, "config.json");
  } catch (const model::ModelError& e) {
    a.reason = "architecture '" + a.model_type + "' is not supported by tierlm yet with this config: " + e.what();
    return a;
  }
  a.supported = true;
  a.weight_format = stored_weight_format(config, shape);
  // MXFP4 experts (gpt-oss) stay MXFP4 in the tier unless a packed file says otherwise.
  a.expert_format =
      shape.packed_expert_format.value_or(config.mxfp4_experts ? kernels::WeightFormat::mxfp4 : a.weight_format);
  a.profile = model_profile_from_config(config, a.weight_format, a.expert_format);
  PlanRequest base;
  base.budget_bytes = request.budget_bytes;
  base.gpu_budget_bytes = request.gpu_budget_bytes;
  base.kv_codec = request.kv_codec;
  a.context = std::min<int64_t>(request.context, config.max_position_embeddings);
  a.prompt_tokens = std::min(request.prompt_tokens, a.context);
  auto plan_at = [&](int64_t context) -> std::optional<Plan> {
    PlanRequest r = base;
    r.context = context;
    try {
      return make_plan(device, a.profile, r);
    } catch (const PlanError&) {
      return std::nullopt;
    }
  };
  if (request.largest_context) {
    // The planner's answer is monotone in context (KV only grows), so a binary search over it.
    int64_t low = 0, high = config.max_position_embeddings;
    while (low < high) {
      const int64_t mid = (low + high + 1) / 2;
      if (mid >= 16 && plan_at(mid)) low = mid;
      else high = mid - 1;
    }
    a.largest_context = low;
  }
  base.context = a.context;
  try {
    a.plan = make_plan(device, a.profile, base);
  } catch (const PlanError& e) {
    a.reason = e.what();
  }
  if (a.plan && request.prefill) {
    PrefillRates& rates = *request.prefill;
    if (std::none_of(rates.gemms.begin(), rates.gemms.end(), [&](const PrefillGemm& g) {
          return g.threads == a.plan->threads && g.format == a.profile.weight_format;
        })) {
      ProbeOptions probe;
      probe.seconds_per_probe = kPrefillProbeSeconds;
      probe.memory_budget = probe_memory_budget(probe_memory());
      PrefillRates probed = probe_prefill(a.profile, a.plan->threads, a.plan->kv_codec, probe);
      for (PrefillGemm& g : probed.gemms) rates.gemms.push_back(std::move(g));
      rates.gate_seconds = probed.gate_seconds;
      rates.row_seconds = probed.row_seconds;
      rates.attention_seconds = probed.attention_seconds;
      rates.attention_threads = probed.attention_threads;
      rates.attention_codec = probed.attention_codec;
      rates.expert_gflops = probed.expert_gflops;
      rates.expert_threads = probed.expert_threads;
      rates.expert_rows = probed.expert_rows;
      rates.expert_format = probed.expert_format;
    }
    a.profile.prefill = rates;
    a.plan->prediction.prefill_tokens_per_second = predicted_prefill_rate(device, a.profile, *a.plan);
  }
  if (a.plan) {
    a.time_to_first_token_seconds = prefill_seconds(device, a.profile, *a.plan, a.prompt_tokens);
    if (a.profile.moe()) {
      const double total = double(a.profile.moe_layers * a.profile.experts);
      a.streamed_expert_fraction = total > 0 ? 1.0 - double(a.plan->resident_count()) / total : 0.0;
    }
  }
  return a;
}

bj::object to_json(const FitAnswer& a) {
  bj::object out{{"model_type", a.model_type}, {"supported", a.supported}};
  if (!a.supported) {
    out["reason"] = a.reason;
    return out;
  }
  out["weight_format"] = kernels::format_name(a.weight_format);
  if (a.profile.moe()) out["expert_format"] = kernels::format_name(a.expert_format);
  out["context"] = a.context;
  out["largest_context"] = a.largest_context;
  out["fits"] = a.plan.has_value();
  if (!a.plan) {
    out["reason"] = a.reason;
    return out;
  }
  const Prediction& p = a.plan->prediction;
  out["plan"] = to_json(*a.plan);
  bj::object predicted{{"decode_tokens_per_second", p.decode_tokens_per_second},
                       {"prefill_tokens_per_second", p.prefill_tokens_per_second},
                       {"time_to_first_token_seconds", a.time_to_first_token_seconds},
                       {"prompt_tokens", a.prompt_tokens},
                       {"memory_bytes", p.total_memory()},
                       {"expert_hit_rate", p.expert_hit_rate},
                       {"miss_bytes_per_token", p.miss_bytes_per_token},
                       {"streamed_expert_fraction", a.streamed_expert_fraction}};
  out["predicted"] = std::move(predicted);
  return out;
}

}  // namespace tierlm::calibrate
