// Oracle: the same model with an f16 KV cache (and f32, exact). For each fixture model: a 2,000-token sequence
// sampled from the model itself (f32 cache, temperature 1, fixed seed) is run through chunked prefill (64-token
// chunks, logits at every position) once per KV codec; we report the mean KL(p_f16 || p_codec) of the next-token
// distributions and the top-1 agreement with f16. Includes the QJL ablation at equal key bits (turbo3's 4-bit MSE
// keys vs 3-bit keys + QJL, the old turbo3, with the same 3-bit values). Target from the issue: q8 agrees with f16
// on >= 99% of top-1 tokens on the fixture models. tierlm-tiny (the trained default model, head_dim 64, 1,024
// positions) is measured too, unasserted.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/engine/forward.h"
#include "runtime/model/model.h"

using namespace tierlm;
using kv::Codec;

namespace {

struct Variant {
  std::string name;
  engine::KVCacheOptions options;
};

std::vector<double> log_softmax(const float* x, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  double mx = *std::max_element(x, x + n), sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
  return out;
}

std::vector<float> all_logits(const model::ModelWeights& w, kernels::ThreadPool& pool, tiering::Ledger& ledger,
                              const std::vector<int32_t>& tokens, const engine::KVCacheOptions& options) {
  const int64_t n = int64_t(tokens.size()), V = w.config.vocab_size, chunk = 64;
  engine::Forward forward(w, pool, ledger, chunk, n);
  engine::KVCache cache(w.config, n, ledger, options);
  std::vector<float> logits(size_t(n * V));
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t len = std::min(chunk, n - i);
    forward.run(std::span(tokens).subspan(size_t(i), size_t(len)), i, cache, &logits[size_t(i * V)], true);
  }
  return logits;
}

class KVModelQuality : public ::testing::TestWithParam<std::string> {};

TEST_P(KVModelQuality, KLAndTop1AgainstF16) {
  const std::string name = GetParam();
  const auto root = std::filesystem::path(TIERLM_SOURCE_DIR);
  const auto path = name == "tierlm-tiny" ? root / "profiles/models/tierlm-tiny" : root / "tests/fixtures/models" / name;
  tiering::Ledger ledger;
  model::LoadOptions load;
  load.ledger = &ledger;
  const auto w = model::load_model(path, load);
  const int64_t V = w.config.vocab_size;
  const int64_t n = std::min<int64_t>(2000, w.config.max_position_embeddings);
  kernels::ThreadPool pool(2);

  // The sequence: sampled from the model with an exact cache, so attention sees the model's own context.
  std::vector<int32_t> tokens = {1};
  {
    engine::Forward forward(w, pool, ledger, 1, n);
    engine::KVCache cache(w.config, n, ledger, {Codec::f32, {}, {}});
    std::vector<float> logits(static_cast<size_t>(V));
    std::mt19937 rng(1234);
    while (int64_t(tokens.size()) < n) {
      forward.run(std::span(&tokens.back(), 1), int64_t(tokens.size()) - 1, cache, logits.data());
      const auto lp = log_softmax(logits.data(), V);
      std::vector<double> p(lp.size());
      for (size_t i = 0; i < p.size(); ++i) p[i] = std::exp(lp[i]);
      tokens.push_back(int32_t(std::discrete_distribution<int>(p.begin(), p.end())(rng)));
    }
  }
  const std::vector<Variant> variants = {
      {"f32", {Codec::f32, {}, {}}},
      {"q8", {Codec::q8, {}, {}}},
      {"turbo4", {Codec::turbo4, {}, {}}},
      {"turbo3", {Codec::turbo3, {}, {}}},
      {"K3+QJL,V3(old t3)", {Codec::turbo3, {}, kv::TurboSpec{3, true, 3}}},
      {"K2+QJL,V3", {Codec::turbo3, {}, kv::TurboSpec{2, true, 3}}},
      {"K3,V3(noQJL)", {Codec::turbo3, {}, kv::TurboSpec{3, false, 3}}},
  };
  const auto ref = all_logits(w, pool, ledger, tokens, {Codec::f16, {}, {}});
  double turbo3_kl = 0, qjl_kl = 0;
  std::printf("[%s] %lld tokens (head_dim %lld), vs f16 KV: mean KL, max KL, top-1 agreement\n", name.c_str(),
              (long long)n, (long long)w.config.head_dim);
  for (const Variant& v : variants) {
    const auto got = all_logits(w, pool, ledger, tokens, v.options);
    double kl_sum = 0, kl_max = 0;
    int64_t agree = 0, worst = 0, above_one = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* a = &ref[size_t(i * V)];
      const float* b = &got[size_t(i * V)];
      const auto la = log_softmax(a, V), lb = log_softmax(b, V);
      double kl = 0;
      for (int64_t j = 0; j < V; ++j) kl += std::exp(la[size_t(j)]) * (la[size_t(j)] - lb[size_t(j)]);
      kl_sum += kl;
      if (kl > kl_max) kl_max = kl, worst = i;
      above_one += kl > 1.0;
      agree += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
    }
    const double top1 = double(agree) / double(n);
    std::printf("  %-17s KL %.3e  max %.3e (position %lld; %lld positions > 1 nat)  top-1 %.2f%%\n", v.name.c_str(),
                kl_sum / double(n), kl_max, (long long)worst, (long long)above_one, 100 * top1);
    // The target is on the fixture models; tierlm-tiny (trained, not a fixture) is reported alongside.
    if (v.name == "q8" && name != "tierlm-tiny") {
      EXPECT_GE(top1, 0.99) << "q8 top-1 agreement with f16";
    }
    if (v.name == "f32") {
      EXPECT_GE(top1, 0.99);
    }
    if (v.name == "turbo3") turbo3_kl = kl_sum / double(n);
    if (v.name.starts_with("K3+QJL")) qjl_kl = kl_sum / double(n);
  }
  // The same key planes spent on a 4th Lloyd-Max bit beat 3 bits + a QJL sign plane on every model (measured mean KL
  // 0.54-0.75x of the QJL variant's on the six models; on code-small +0.4% perplexity against +2.4%, six seeds).
  EXPECT_LT(turbo3_kl, qjl_kl) << "turbo3's 4-bit MSE keys against 3-bit keys + QJL";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KVModelQuality,
                         ::testing::Values("llama3", "smollm", "mistral", "qwen2", "qwen3", "tierlm-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
