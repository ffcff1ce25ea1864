// Gemma 4 through the one forward pass, against transformers 5.17 (tools/make_fixtures.py made the fixtures on the
// device): gemma4-dense (E2B-like: per-layer inputs, KV shared by the last 3 layers, double-wide MLP there, full
// layers with head_dim 32), gemma4-moe (26B-A4B-like: k_eq_v full layer with 1 KV head, 8 experts top-2 beside the
// dense MLP, soft-capping) and gemma4-cg (the ConditionalGeneration text tower beside vision tensors). The MoE
// fixtures also run in moe_forward_test's streaming / warm / packed cases. Here: logits at every prompt position and
// each greedy step within 1e-3 relative, 32 greedy tokens exact; chunked prefill (1, 5, 24 tokens) equal to the
// whole prompt (windowed rings sized for the chunk, KV-shared layers reading their source), a batch equal to each
// sequence alone, and discriminating checks (the per-layer inputs and the soft-cap matter).
#include <algorithm>
#include <cmath>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"

#include "runtime/engine/forward.h"
#include "runtime/model/model.h"

using namespace tierlm;

namespace {

// The exact KV codec (f32), rings sized for chunks of max_chunk tokens (0: the capacity).
engine::KVCacheOptions exact_kv(int64_t max_chunk = 0) {
  engine::KVCacheOptions o;
  o.codec = kv::Codec::f32;
  o.max_chunk = max_chunk;
  return o;
}

using tierlm::fixtures::argmax;
using tierlm::fixtures::fixture;
using tierlm::fixtures::floats;
using tierlm::fixtures::read_json;
using tierlm::fixtures::relative_error;

std::vector<int32_t> prompt_of(const std::string& name) { return tierlm::fixtures::reference_prompt(fixture(name)); }

model::LoadOptions options_for(tiering::Ledger& ledger) {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.packed_experts = "";
  return o;
}

class Gemma4MatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(Gemma4MatchesTransformers, LogitsAndGreedyTokens) {
  const std::string name = GetParam();
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(fixture(name), options_for(ledger));
  const auto ref = read_json(fixture(name) / "reference.json").as_object();
  const std::vector<int32_t> prompt = prompt_of(name);
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

// Prefill in chunks of 1, 5 and 24 tokens: every position's logits equal the whole prompt's (the 24-token prompt
// outruns the window of 8, so windowed rings wrap; KV-shared layers read their source's pages).
TEST_P(Gemma4MatchesTransformers, ChunkedPrefillEqualsWholePrefill) {
  const std::string name = GetParam();
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(fixture(name), options_for(ledger));
  const std::vector<int32_t> prompt = prompt_of(name);
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward whole(w, pool, ledger, 64, 64);
  engine::KVCache whole_cache(w.config, 64, ledger, exact_kv());
  std::vector<float> expected(size_t(n * V));
  whole.run(prompt, 0, whole_cache, expected.data(), true);
  for (int64_t chunk : {1, 5, 24}) {
    engine::Forward f(w, pool, ledger, chunk, 64);
    engine::KVCache cache(w.config, 64, ledger, exact_kv(chunk));
    std::vector<float> got(size_t(n * V));
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t len = std::min(chunk, n - i);
      f.run(std::span(prompt).subspan(size_t(i), size_t(len)), i, cache, got.data() + i * V, true);
    }
    double worst = 0;
    for (int64_t i = 0; i < n * V; ++i)
      worst = std::max(worst, double(std::fabs(got[size_t(i)] - expected[size_t(i)])));
    EXPECT_LT(worst, 1e-4) << "chunk " << chunk;
  }
}

TEST_P(Gemma4MatchesTransformers, BatchOfSequencesEqualsEachAlone) {
  const std::string name = GetParam();
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(fixture(name), options_for(ledger));
  kernels::ThreadPool pool(2);
  const int64_t V = w.config.vocab_size;
  engine::Forward f(w, pool, ledger, 32, 64);
  const std::vector<int32_t> full = prompt_of(name);
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
  const int32_t na = 7, nb = 200;
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

INSTANTIATE_TEST_SUITE_P(Fixtures, Gemma4MatchesTransformers,
                         // gemma4-moe-mlx4: gemma4-moe in mlx-lm's 4-bit layout (group 32, router at 8 bits,
                         // bf16 scales); its reference ran the dequantized weights, which MLX's math (f32
                         // activations, runtime/kernels/affine_f32.h) reproduces.
                         ::testing::Values("gemma4-dense", "gemma4-moe", "gemma4-cg", "gemma4-moe-mlx4"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The last prompt position's logits of `w` against the fixture's, relative.
double last_logits_error(const model::ModelWeights& w, const std::string& name, tiering::Ledger& ledger) {
  const std::vector<int32_t> prompt = prompt_of(name);
  kernels::ThreadPool pool(2);
  engine::Forward f(w, pool, ledger, 64, 64);
  engine::KVCache cache(w.config, 64, ledger, exact_kv());
  std::vector<float> logits(size_t(w.config.vocab_size));
  f.run(prompt, 0, cache, logits.data());
  const auto ref = read_json(fixture(name) / "reference.json");
  return relative_error(logits.data(), floats(ref.at("prompt_logits").as_array().back()));
}

// The fixtures discriminate: without the per-layer inputs the logits are far from transformers'; without the
// soft-cap (cap 30 over this random model's small logits) they miss the 1e-3 bound the fixture tests hold.
TEST(Gemma4Forward, PerLayerInputsAndSoftCapMatter) {
  tiering::Ledger ledger;
  model::ModelWeights dense = model::load_model(fixture("gemma4-dense"), options_for(ledger));
  ASSERT_LT(last_logits_error(dense, "gemma4-dense", ledger), 1e-3);
  dense.config.per_layer_input_size = 0;
  EXPECT_GT(last_logits_error(dense, "gemma4-dense", ledger), 1e-2);
  model::ModelWeights moe = model::load_model(fixture("gemma4-moe"), options_for(ledger));
  moe.config.final_logit_softcapping = 0;
  EXPECT_GT(last_logits_error(moe, "gemma4-moe", ledger), 2e-3);
}

}  // namespace
