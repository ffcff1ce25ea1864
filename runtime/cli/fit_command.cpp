// `tierlm fit --model ID|DIR` — will a model run on this machine, with what plan and how fast, answered before any
// download: config.json and the safetensors headers (for a hub id: the model-info API and Range reads of each
// shard's header) give the model's shape and format; this machine's calibrated device profile (the wisdom file's,
// else quick probes, or --device FILE) gives the rates; the planner calibrate uses (calibrate/planner.h) makes the
// plan. Architectures tierlm cannot run are named as such.
#include <cstdio>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include "calibrate/fit.h"
#include "calibrate/planner.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/fit_shape.h"
#include "runtime/model/config.h"

namespace tierlm::cli {

namespace {

namespace bj = boost::json;

struct FitOptions {
  std::string model;
  int64_t context = 4096;
  int64_t prompt_tokens = 512;
  double budget_gib = 0;
  double gpu_memory_gib = 0;
  std::vector<double> budgets_gib;  // a table: one plan per budget
  std::string device;  // a device profile JSON instead of this machine's
  bool json = false;
};

constexpr double kGiB = double(1ull << 30);

calibrate::FitRequest request_for(const FitOptions& o, double budget_gib) {
  calibrate::FitRequest r;
  r.budget_bytes = uint64_t(budget_gib * kGiB);
  r.gpu_budget_bytes = uint64_t(o.gpu_memory_gib * kGiB);
  r.context = o.context;
  r.prompt_tokens = o.prompt_tokens;
  return r;
}

void print_header(const FitOptions& o, const calibrate::FitModelShape& shape, const calibrate::FitAnswer& a,
                  const std::string& device_source) {
  const auto& m = a.profile;
  const std::string experts =
      m.moe() ? ", " + std::to_string(m.experts) + " experts top-" + std::to_string(m.top_k) : std::string();
  const std::string expert_format = m.moe() && a.expert_format != a.weight_format
                                        ? " (experts " + std::string(kernels::format_name(a.expert_format)) + ")"
                                        : std::string();
  std::printf("model %s: %s, %lld layers%s, %s%s, %.2f GB of weights stored\n", o.model.c_str(), a.model_type.c_str(),
              (long long)m.layers, experts.c_str(),
              kernels::format_name(a.weight_format),
              expert_format.c_str(),
              double(shape.stored_bytes) / 1e9);
  std::printf("rates from %s\n", device_source.c_str());
}

// One row per budget: what the planner makes of it at the asked context.
void print_table(const FitOptions& o, const std::vector<calibrate::FitAnswer>& answers) {
  std::printf("%-8s %-5s %-7s %-9s %-17s %9s %10s %11s %9s %12s\n", "budget", "fits", "KV", "streamed",
              "resident/slots", "hit rate", "decode t/s", "prefill t/s", "TTFT s", "max context");
  for (size_t i = 0; i < answers.size(); ++i) {
    const auto& a = answers[i];
    if (!a.plan) {
      std::printf("%5.0fGiB %-5s %-7s %-9s %-17s %9s %10s %11s %9s %12lld\n", o.budgets_gib[i], "no", "-", "-", "-",
                  "-", "-", "-", "-", (long long)a.largest_context);
      continue;
    }
    const auto& p = *a.plan;
    const std::string experts =
        a.profile.moe() ? std::to_string(p.resident_count()) + "/" + std::to_string(p.cache_slots) : "-";
    std::printf("%5.0fGiB %-5s %-7s %8.1f%% %-17s %8.1f%% %10.2f %11.1f %9.2f %12lld\n", o.budgets_gib[i], "yes",
                p.kv_codec.c_str(), 100 * a.streamed_expert_fraction, experts.c_str(),
                100 * p.prediction.expert_hit_rate, p.prediction.decode_tokens_per_second,
                p.prediction.prefill_tokens_per_second, a.time_to_first_token_seconds, (long long)a.largest_context);
  }
}

void fit(const FitOptions& o) {
  const calibrate::FitModelShape shape = read_fit_shape(o.model);
  std::string device_source;
  std::optional<calibrate::DeviceProfile> device;
  std::vector<double> budgets = o.budgets_gib.empty() ? std::vector<double>{o.budget_gib} : o.budgets_gib;
  std::vector<calibrate::FitAnswer> answers;
  calibrate::PrefillRates prefill;
  for (double budget : budgets) {
    if (!device) {
      // An unsupported architecture needs no rates: say so before probing anything.
      calibrate::FitRequest names_only;
      names_only.largest_context = false;
      const calibrate::FitAnswer probe = calibrate::fit_model(shape, calibrate::DeviceProfile{}, names_only);
      if (!probe.supported) {
        answers.push_back(probe);
        break;
      }
      device = fit_device(o.device, device_source, o.model);
    }
    calibrate::FitRequest request = request_for(o, budget);
    // This machine's rates (not a --device file's): the model's prefill shapes are timed here, once per thread count.
    if (o.device.empty()) request.prefill = &prefill;
    answers.push_back(calibrate::fit_model(shape, *device, request));
  }
  const calibrate::FitAnswer& first = answers.front();
  bj::object out{{"model", o.model}, {"bytes_fetched", shape.bytes_fetched}, {"stored_bytes", shape.stored_bytes}};
  if (!first.supported) {
    for (auto& [k, v] : calibrate::to_json(first)) out[k] = v;
    if (o.json) std::puts(bj::serialize(out).c_str());
    else
      std::printf("%s: %s (%.2f GB of weights stored)\n", o.model.c_str(), first.reason.c_str(),
                  double(shape.stored_bytes) / 1e9);
    return;
  }
  out["device_source"] = device_source;
  if (!o.budgets_gib.empty()) {
    bj::array rows;
    for (size_t i = 0; i < answers.size(); ++i) {
      bj::object row = calibrate::to_json(answers[i]);
      row["budget_gib"] = o.budgets_gib[i];
      rows.push_back(std::move(row));
    }
    out["model_type"] = first.model_type;
    out["supported"] = true;
    out["budgets"] = std::move(rows);
    if (o.json) {
      std::puts(bj::serialize(out).c_str());
      return;
    }
    print_header(o, shape, first, device_source);
    std::printf("context %lld, time to first token for a %lld-token prompt\n", (long long)first.context,
                (long long)first.prompt_tokens);
    print_table(o, answers);
    if (shape.bytes_fetched) std::printf("read from the hub: %llu bytes (config.json and safetensors headers)\n",
                                         (unsigned long long)shape.bytes_fetched);
    return;
  }
  for (auto& [k, v] : calibrate::to_json(first)) out[k] = v;
  if (o.json) {
    std::puts(bj::serialize(out).c_str());
    return;
  }
  print_header(o, shape, first, device_source);
  if (!first.plan) {
    std::printf("does not fit at context %lld: %s\n", (long long)first.context, first.reason.c_str());
  } else {
    const auto& plan = *first.plan;
    const auto& p = plan.prediction;
    std::printf("fits at context %lld in a %.2f GiB budget: %d threads, KV %s, %d GPU layers", (long long)first.context,
                double(plan.budget_bytes) / kGiB, plan.threads, plan.kv_codec.c_str(), plan.gpu_layers);
    if (first.profile.moe())
      std::printf(", %lld resident experts (%.1f%% streamed), %lld cache slots", (long long)plan.resident_count(),
                  100 * first.streamed_expert_fraction, (long long)plan.cache_slots);
    if (plan.gpu_layers > 0 && first.profile.moe())
      std::printf(", %lld experts in VRAM (the others %s)", (long long)plan.gpu_resident_count(),
                  plan.gpu_cpu_expert_rows > 0 ? "on the CPU in decode" : "copied in");
    std::printf("\npredicted: decode %.1f tok/s, prefill %.1f tok/s, time to first token %.2f s (%lld-token prompt), "
                "memory %.2f GiB\n", p.decode_tokens_per_second, p.prefill_tokens_per_second,
                first.time_to_first_token_seconds, (long long)first.prompt_tokens, double(p.total_memory()) / kGiB);
  }
  std::printf("largest context that fits: %lld tokens\n", (long long)first.largest_context);
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
  cmd->add_option("--gpu-memory", o->gpu_memory_gib, "VRAM the plan may use, in GiB (0: the free device memory minus 1 GiB)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--budgets", o->budgets_gib, "A table: one plan per budget in GiB (e.g. 8,16,32,64)")
      ->delimiter(',')->check(CLI::PositiveNumber)->excludes("--budget");
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for the time to first token")->check(CLI::Range(int64_t(1), int64_t(1) << 22));
  cmd->add_option("--device", o->device, "A device profile JSON (profiles/devices/) instead of this machine");
  cmd->add_flag("--json", o->json, "Machine-readable JSON");
  cmd->callback([o] { fit(*o); });
}

}  // namespace tierlm::cli
