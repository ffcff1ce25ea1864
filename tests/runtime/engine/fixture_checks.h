// tests/runtime/engine/fixture_checks.h — the checks every transformers reference fixture of a family goes through
// on the CPU forward pass: logits of every prompt position and of each greedy step within 1e-3 relative with the 32
// greedy tokens exact; chunked prefill (1, 5, 24 tokens) equal to the whole prompt; a batch of two sequences equal
// to each alone. Header-only, gtest assertions; used by the per-family forward tests (gemma4, gpt_oss).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"

#include "runtime/engine/forward.h"
#include "runtime/model/model.h"

namespace tierlm::fixtures {

// The exact KV codec (f32), rings sized for chunks of max_chunk tokens (0: the capacity).
inline engine::KVCacheOptions exact_kv(int64_t max_chunk = 0) {
  engine::KVCacheOptions o;
  o.codec = kv::Codec::f32;
  o.max_chunk = max_chunk;
  return o;
}

// Loads a fixture from its safetensors alone (no packed expert file).
inline model::LoadOptions fixture_load_options(tiering::Ledger& ledger) {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.packed_experts = "";
  return o;
}

inline model::ModelWeights load_fixture(const std::string& name, tiering::Ledger& ledger) {
  return model::load_model(fixture(name), fixture_load_options(ledger));
}

// Prompt logits at every position, each greedy step's logits (1e-3 relative) and the greedy tokens (exact).
inline void expect_logits_and_greedy(const model::ModelWeights& w, const std::string& name, tiering::Ledger& ledger) {
  const auto ref = read_json(fixture(name) / "reference.json").as_object();
  const std::vector<int32_t> prompt = reference_prompt(fixture(name));
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, 64, 128);
  engine::KVCache cache(w.config, 128, ledger, exact_kv());
  std::vector<float> logits(size_t(n * V));
  forward.run(prompt, 0, cache, logits.data(), /*all_logits=*/true);
  const auto& prompt_logits = ref.at("prompt_logits").as_array();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i)
    worst = std::max(worst, relative_error(&logits[size_t(i * V)], floats(prompt_logits[size_t(i)])));
  EXPECT_LT(worst, 1e-3) << "prompt logits";
  const auto& greedy = ref.at("greedy").as_array();
  const auto& steps = ref.at("step_logits").as_array();
  int32_t next = argmax(&logits[size_t((n - 1) * V)], V);
  std::vector<float> step(static_cast<size_t>(V));
  double worst_step = 0;
  for (size_t s = 0; s < greedy.size(); ++s) {
    const int32_t expected = int32_t(greedy[s].as_int64());
    ASSERT_EQ(next, expected) << "greedy token " << s;
    forward.run(std::span(&expected, 1), n + int64_t(s), cache, step.data());
    worst_step = std::max(worst_step, relative_error(step.data(), floats(steps[s])));
    next = argmax(step.data(), V);
  }
  EXPECT_LT(worst_step, 1e-3) << "decode-step logits";
  std::printf("[%s] prompt logits rel err %.2e, step logits rel err %.2e, greedy %zu/%zu (transformers' margin %.4f)\n",
              name.c_str(), worst, worst_step, greedy.size(), greedy.size(), ref.at("min_margin").to_number<double>());
}

// Prefill in chunks of 1, 5 and 24 tokens: every position's logits equal the whole prompt's (a prompt longer than
// a sliding window makes windowed rings wrap).
inline void expect_chunked_prefill_equals_whole(const model::ModelWeights& w, const std::string& name,
                                                tiering::Ledger& ledger) {
  const std::vector<int32_t> prompt = reference_prompt(fixture(name));
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  std::vector<float> expected;  // the first pass (chunk 64: the whole prompt at once)
  for (int64_t chunk : {64, 1, 5, 24}) {
    engine::Forward f(w, pool, ledger, chunk, 64);
    engine::KVCache cache(w.config, 64, ledger, exact_kv(chunk));
    std::vector<float> got(size_t(n * V));
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t len = std::min(chunk, n - i);
      f.run(std::span(prompt).subspan(size_t(i), size_t(len)), i, cache, got.data() + i * V, true);
    }
    if (expected.empty()) {
      expected = std::move(got);
      continue;
    }
    double worst = 0;
    for (int64_t i = 0; i < n * V; ++i)
      worst = std::max(worst, double(std::fabs(got[size_t(i)] - expected[size_t(i)])));
    EXPECT_LT(worst, 1e-4) << "chunk " << chunk;
  }
}

// Two sequences (the prompt split at 13) prefilled and decoded one step in one batch equal each run alone.
inline void expect_batch_equals_alone(const model::ModelWeights& w, const std::string& name, tiering::Ledger& ledger) {
  kernels::ThreadPool pool(2);
  const int64_t V = w.config.vocab_size;
  engine::Forward f(w, pool, ledger, 32, 64);
  const std::vector<int32_t> full = reference_prompt(fixture(name));
  const std::vector<int32_t> a(full.begin(), full.begin() + 13), b(full.begin() + 13, full.end());
  const engine::KVCacheOptions kv = exact_kv();
  engine::KVCache ca(w.config, 64, ledger, kv), cb(w.config, 64, ledger, kv), xa(w.config, 64, ledger, kv),
      xb(w.config, 64, ledger, kv);
  std::vector<float> la(static_cast<size_t>(V)), lb(la), ya(la), yb(la);
  f.run(a, 0, ca, la.data());
  f.run(b, 0, cb, lb.data());
  std::vector<engine::BatchItem> prefill = {{a, 0, &xa, ya.data()}, {b, 0, &xb, yb.data()}};
  f.run_batch(prefill);
  for (int64_t i = 0; i < V; ++i) {
    ASSERT_NEAR(ya[size_t(i)], la[size_t(i)], 1e-4f);
    ASSERT_NEAR(yb[size_t(i)], lb[size_t(i)], 1e-4f);
  }
  const int32_t na = 7, nb = int32_t(std::min<int64_t>(200, V - 1));
  f.run(std::span(&na, 1), int64_t(a.size()), ca, la.data());
  f.run(std::span(&nb, 1), int64_t(b.size()), cb, lb.data());
  std::vector<engine::BatchItem> decode = {{std::span(&na, 1), int64_t(a.size()), &xa, ya.data()},
                                           {std::span(&nb, 1), int64_t(b.size()), &xb, yb.data()}};
  f.run_batch(decode);
  for (int64_t i = 0; i < V; ++i) {
    ASSERT_NEAR(ya[size_t(i)], la[size_t(i)], 1e-4f);
    ASSERT_NEAR(yb[size_t(i)], lb[size_t(i)], 1e-4f);
  }
}

// The last prompt position's logits of `w` against the fixture's, relative (for checks that an option matters).
inline double last_logits_error(const model::ModelWeights& w, const std::string& name, tiering::Ledger& ledger) {
  const std::vector<int32_t> prompt = reference_prompt(fixture(name));
  kernels::ThreadPool pool(2);
  engine::Forward f(w, pool, ledger, 64, 64);
  engine::KVCache cache(w.config, 64, ledger, exact_kv());
  std::vector<float> logits(size_t(w.config.vocab_size));
  f.run(prompt, 0, cache, logits.data());
  const auto ref = read_json(fixture(name) / "reference.json");
  return relative_error(logits.data(), floats(ref.at("prompt_logits").as_array().back()));
}

}  // namespace tierlm::fixtures
