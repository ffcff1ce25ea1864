// bench/calibrate_prediction_bench.cpp — prediction vs reality for the planner: a synthetic Qwen3-MoE-shaped model
// (runtime/model/synthetic_moe.h) on disk, the device probed (--quick), router traces over profiles/prompts, then at
// two budgets (experts partly resident) the plan's predicted decode tok/s and memory by account against a measured
// run with that plan applied (token-by-token forward steps over the prompts, the plan's threads, KV codec, expert
// cache and reader settings, ledger budget). Target: within 25%.
// Usage: calibrate_prediction_bench [--dir D] [--keep] [--tokens N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "calibrate/apply_plan.h"
#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "calibrate/probes.h"
#include "runtime/engine/forward.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/kv/codec.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic_moe.h"

using namespace tierlm;
namespace fs = std::filesystem;

namespace {

constexpr double MiB = double(1 << 20);

std::vector<std::vector<int32_t>> prompt_tokens(const std::string& dir, int64_t vocab, size_t per_prompt) {
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::vector<int32_t>> out;
  for (auto& f : files) {
    std::ifstream in(f);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<int32_t> t;
    for (unsigned char c : text) t.push_back(int32_t(c % uint32_t(vocab)));  // as the router trace does
    if (t.size() > per_prompt) t.resize(per_prompt);
    out.push_back(std::move(t));
  }
  return out;
}

struct Measured {
  double tokens_per_second = 0, hit_rate = 0;
  std::map<std::string, uint64_t> peak;
};

Measured run_plan(const fs::path& dir, const calibrate::Plan& plan, const std::vector<std::vector<int32_t>>& prompts,
                  int warmup_prompts) {
  tiering::Ledger ledger(plan.budget_bytes);
  model::LoadOptions lo;
  lo.ledger = &ledger;
  lo.weight_format = kernels::WeightFormat::q4;
  lo.experts = calibrate::expert_tier_options(plan);
  kv::set_default_codec(kv::parse_codec(plan.kv_codec));
  auto w = model::load_model(dir, lo);
  kernels::ThreadPool pool(plan.threads);
  engine::Forward forward(w, pool, ledger, plan.prefill_chunk, plan.context);
  std::vector<float> logits(size_t(w.config.vocab_size));
  Measured m;
  double seconds = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (int(i) == warmup_prompts) w.experts->cache().reset_counters();
    engine::KVCache cache(w.config, plan.context, ledger);
    const auto start = std::chrono::steady_clock::now();
    for (size_t t = 0; t < prompts[i].size(); ++t) forward.run(std::span(&prompts[i][t], 1), int64_t(t), cache, logits.data());
    if (int(i) >= warmup_prompts) {
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      tokens += int64_t(prompts[i].size());
    }
  }
  m.tokens_per_second = double(tokens) / seconds;
  m.hit_rate = w.experts->telemetry().hit_rate();
  for (auto& a : ledger.snapshot()) m.peak[a.name] = a.peak_bytes;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = "/work/calibrate-bench-model";
  bool keep = false;
  size_t per_prompt = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--keep") keep = true;
    else if (a == "--tokens" && i + 1 < argc) per_prompt = std::stoul(argv[++i]);
  }
  model::SyntheticMoeSpec spec;
  spec.layers = 16;
  spec.experts = 64;
  spec.top_k = 8;
  spec.hidden = 1024;
  spec.expert_intermediate = 512;
  spec.heads = 16;
  spec.kv_heads = 4;
  spec.head_dim = 64;
  spec.vocab = 8192;
  if (!fs::exists(dir / "config.json")) {
    std::printf("writing synthetic MoE to %s (%.0f MiB of experts)\n", dir.c_str(),
                double(model::synthetic_moe_expert_bytes(spec)) / MiB);
    model::write_synthetic_moe(dir, spec);
  }
  calibrate::ProbeOptions po;
  po.quick = true;
  po.storage_dir = dir.string();
  const calibrate::DeviceProfile device = calibrate::probe_device(po);
  std::printf("device: %s; RAM read %.1f GB/s, storage best %.2f GB/s (O_DIRECT %s)\n", device.identity().c_str(),
              device.read_gbs(), device.storage.best_gbs(), device.storage.direct_io ? "yes" : "no");

  calibrate::ModelProfileOptions mo;
  mo.weight_format = "q4";
  mo.max_tokens_per_prompt = int64_t(per_prompt);
  mo.max_seconds = 120;
  for (auto& c : device.compute) mo.timing_threads.push_back(c.threads);
  mo.timing_seconds = 0.5;
  calibrate::RouterTrace trace;
  mo.trace = &trace;
  const calibrate::ModelProfile profile = calibrate::measure_model_profile(dir, mo);
  std::printf("model: dense %.1f MiB, %lld experts of %.2f MiB (%.0f MiB), %s\n", double(profile.dense_bytes()) / MiB,
              (long long)(profile.moe_layers * profile.experts), double(profile.expert_bytes) / MiB,
              double(profile.total_expert_bytes()) / MiB, profile.frequency_source.c_str());

  for (auto& t : profile.timings)
    std::printf("timing @%d threads: step %.3f ms (fixed routing, experts in memory), expert %.1f us, router %.1f us, "
                "miss %.0f us alone / %.0f us batched\n", t.threads, t.step_seconds * 1e3, t.expert_seconds * 1e6,
                t.router_seconds * 1e6, t.miss_seconds * 1e6, t.miss_batch_seconds * 1e6);
  const auto prompts = prompt_tokens(std::string(TIERLM_SOURCE_DIR) + "/profiles/prompts", spec.vocab, per_prompt);
  std::printf("\n%-8s %10s %10s %9s %9s %9s %9s %7s\n", "budget", "resident", "slots", "pred t/s", "meas t/s",
              "ratio", "pred hit", "meas hit");
  std::vector<std::string> memory_lines;
  for (double share : {0.35, 0.7}) {
    calibrate::PlanRequest r;
    r.context = int64_t(per_prompt) + 8;
    r.trace = &trace;
    r.budget_bytes = profile.dense_bytes() + uint64_t(share * double(profile.total_expert_bytes())) + (64u << 20);
    const calibrate::Plan plan = calibrate::make_plan(device, profile, r);
    const Measured m = run_plan(dir, plan, prompts, 4);
    const double pred = plan.prediction.decode_tokens_per_second;
    std::printf("%6.0fMiB %10lld %10lld %9.2f %9.2f %9.2f %8.1f%% %6.1f%%\n", double(plan.budget_bytes) / MiB,
                (long long)plan.resident_count(), (long long)plan.cache_slots, pred, m.tokens_per_second,
                m.tokens_per_second / pred, 100 * plan.prediction.expert_hit_rate, 100 * m.hit_rate);
    std::string terms;
    for (auto& [term, seconds] : plan.prediction.step_seconds) terms += fmt::format(" {} {:.3f} ms", term, seconds * 1e3);
    memory_lines.push_back(fmt::format("  budget {:6.0f} MiB  {} threads, predicted step:{}", double(plan.budget_bytes) / MiB,
                                       plan.threads, terms));
    for (auto [account, bytes] : plan.prediction.memory) {
      const uint64_t peak = m.peak.count(account) ? m.peak.at(account) : 0;
      if (account == "scratch") bytes = plan.prediction.scratch_peak_bytes;  // the ledger's peak includes loading
      memory_lines.push_back(fmt::format("  budget {:6.0f} MiB  {:<17} predicted {:8.1f} MiB  measured peak {:8.1f} MiB",
                                         double(plan.budget_bytes) / MiB, account, double(bytes) / MiB,
                                         double(peak) / MiB));
    }
    std::fflush(stdout);
  }
  std::printf("\nmemory by account\n");
  for (auto& l : memory_lines) std::printf("%s\n", l.c_str());
  if (!keep) fs::remove_all(dir);
  return 0;
}
