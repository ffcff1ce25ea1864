// bench/routing_stats_bench.cpp — how a MoE model's real router routes the calibration prompts: per layer, the
// popularity skew (share of all selections taken by the most popular 10% of experts; 10% when uniform) and the
// token-to-token reuse (share of a token's top-k the previous token also chose in that layer), beside the reuse
// that independent draws with the same popularity would give. Used by bench/realscale.sh to document the synthetic
// model's routing (tools/peer/synthetic_mlx_moe.cpp) and comparable on any MoE folder.
//
// Usage: routing_stats_bench MODEL_DIR [--prompts DIR] [--max-prompts N] [--tokens-per-prompt N] [--seconds S]
// Prints a Markdown table (every 8th layer and the mean) on stdout.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "calibrate/model_profile.h"

using namespace tierlm;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: routing_stats_bench MODEL_DIR [--prompts DIR] [--max-prompts N] "
                         "[--tokens-per-prompt N] [--seconds S]\n");
    return 2;
  }
  calibrate::ModelProfileOptions o;
  o.max_prompts = 8;
  o.max_seconds = 120;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--prompts") o.prompts_dir = v;
    else if (k == "--max-prompts") o.max_prompts = std::stoll(v);
    else if (k == "--tokens-per-prompt") o.max_tokens_per_prompt = std::stoll(v);
    else if (k == "--seconds") o.max_seconds = std::stod(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  calibrate::RouterTrace trace;
  o.trace = &trace;
  try {
    calibrate::measure_model_profile(argv[1], o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "routing_stats: %s\n", e.what());
    return 1;
  }
  const int64_t L = trace.layers, E = trace.experts, k = trace.top_k, T = trace.tokens();
  const int64_t top = std::max<int64_t>(1, E / 10);
  auto at = [&](int64_t t, int64_t l) { return &trace.selections[size_t((t * L + l) * k)]; };
  std::printf("routing of %lld tokens (%lld layers x %lld experts, top-%lld)\n\n", (long long)T, (long long)L,
              (long long)E, (long long)k);
  std::printf("| layer | top-10%% share | reuse t-1 | reuse if independent |\n|---|---|---|---|\n");
  double sum_share = 0, sum_reuse = 0, sum_independent = 0, min_share = 1, max_share = 0;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<int64_t> count(size_t(E), 0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) ++count[size_t(at(t, l)[j])];
    std::vector<int64_t> sorted = count;
    std::sort(sorted.rbegin(), sorted.rend());
    const double share = double(std::accumulate(sorted.begin(), sorted.begin() + top, int64_t(0))) / double(T * k);
    int64_t overlap = 0;
    for (int64_t t = 1; t < T; ++t)
      for (int64_t j = 0; j < k; ++j)
        overlap += std::find(at(t - 1, l), at(t - 1, l) + k, at(t, l)[j]) != at(t - 1, l) + k;
    const double reuse = T > 1 ? double(overlap) / double((T - 1) * k) : 0;
    // Independent tokens with the same inclusion probabilities p_e = count_e / T share sum p_e^2 / k of a top-k.
    double independent = 0;
    for (int64_t c : count) independent += (double(c) / double(T)) * (double(c) / double(T));
    independent /= double(k);
    sum_share += share, sum_reuse += reuse, sum_independent += independent;
    min_share = std::min(min_share, share), max_share = std::max(max_share, share);
    if (l % 8 == 0 || l == L - 1)
      std::printf("| %lld | %.1f%% | %.1f%% | %.1f%% |\n", (long long)l, 100 * share, 100 * reuse, 100 * independent);
  }
  std::printf("| mean | %.1f%% (%.1f-%.1f%%) | %.1f%% | %.1f%% |\n", 100 * sum_share / L, 100 * min_share,
              100 * max_share, 100 * sum_reuse / L, 100 * sum_independent / L);
  std::printf("\nuniform routing: top-10%% share %.1f%%, reuse %.1f%%\n", 100.0 * double(top) / double(E),
              100.0 * double(k) / double(E));
  return 0;
}
