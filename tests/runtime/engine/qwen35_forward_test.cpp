// Oracle: transformers 5.17 fixtures (tests/fixtures/models/qwen3_5*, made on the device) — Qwen3.5 dense and MoE
// with Gated DeltaNet layers among gated full-attention layers: the ConditionalGeneration checkpoints (vision tower
// and mtp tensors skipped by name), the text-only Qwen3_5MoeForCausalLM (another layer pattern, tied embeddings) and
// an mlx-lm 4-bit layout. Logits of every prompt position and of each of 32 greedy steps within 1e-3 relative, the
// greedy tokens identical. Then the recurrent state's own properties: chunked prefill (chunks of 1, 5, 24) equals
// whole prefill, a batch of sequences equals each alone, a reused cache starts clean, the state is in the ledger, and
// a chunk that would skip or rewind the recurrent state is refused.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"
#include "tests/runtime/model/safetensors_writer.h"

#include "runtime/engine/forward.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"

using namespace tierlm;

namespace {

using fixtures::argmax;
using fixtures::fixture;
using fixtures::floats;
using fixtures::read_json;
using fixtures::relative_error;

std::vector<int32_t> prompt_of(const std::filesystem::path& dir) {
  const auto ref = read_json(dir / "reference.json").as_object();
  std::vector<int32_t> prompt;
  for (auto& t : ref.at("prompt").as_array()) prompt.push_back(int32_t(t.as_int64()));
  return prompt;
}

model::LoadOptions options_for(tiering::Ledger& ledger) {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.packed_experts = "";  // never pick up a packed file lying in the fixture folder
  return o;
}

struct Match {
  double prompt_error = 0, step_error = 0;
  int greedy_matches = 0, greedy_total = 0;
};

// The fixture's prompt in chunks of `chunk` tokens, then its 32 greedy steps, against reference.json.
Match run_reference(const std::filesystem::path& dir, int64_t chunk) {
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(dir, options_for(ledger));
  const auto ref = read_json(dir / "reference.json").as_object();
  const std::vector<int32_t> prompt = prompt_of(dir);
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, 64, 128);
  engine::KVCache cache(w.config, 128, ledger);
  std::vector<float> logits(size_t(n * V));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    forward.run(std::span(prompt).subspan(size_t(at), size_t(len)), at, cache, logits.data() + at * V, true);
  }
  Match m;
  const auto& prompt_logits = ref.at("prompt_logits").as_array();
  for (int64_t i = 0; i < n; ++i)
    m.prompt_error = std::max(m.prompt_error, relative_error(&logits[size_t(i * V)], floats(prompt_logits[size_t(i)])));
  const auto& greedy = ref.at("greedy").as_array();
  const auto& steps = ref.at("step_logits").as_array();
  int32_t next = argmax(&logits[size_t((n - 1) * V)], V);
  std::vector<float> step(static_cast<size_t>(V));
  for (size_t s = 0; s < greedy.size(); ++s) {
    const int32_t expected = int32_t(greedy[s].as_int64());
    m.greedy_matches += next == expected;
    ++m.greedy_total;
    forward.run(std::span(&expected, 1), n + int64_t(s), cache, step.data());
    m.step_error = std::max(m.step_error, relative_error(step.data(), floats(steps[s])));
    next = argmax(step.data(), V);
  }
  return m;
}

class Qwen35MatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen35MatchesTransformers, LogitsAndGreedyTokens) {
  const Match m = run_reference(fixture(GetParam()), 64);
  EXPECT_LT(m.prompt_error, 1e-3) << "prompt logits";
  EXPECT_LT(m.step_error, 1e-3) << "decode-step logits";
  EXPECT_EQ(m.greedy_matches, m.greedy_total) << "greedy tokens";
  std::printf("[%s] prompt rel err %.2e, step rel err %.2e, greedy %d/%d\n", GetParam().c_str(), m.prompt_error,
              m.step_error, m.greedy_matches, m.greedy_total);
}

// The recurrent state carried across chunk boundaries: any chunking gives transformers' logits.
TEST_P(Qwen35MatchesTransformers, ChunkedPrefillMatchesToo) {
  for (int64_t chunk : {1, 5}) {
    const Match m = run_reference(fixture(GetParam()), chunk);
    EXPECT_LT(m.prompt_error, 1e-3) << "chunk " << chunk;
    EXPECT_LT(m.step_error, 1e-3) << "chunk " << chunk;
    EXPECT_EQ(m.greedy_matches, m.greedy_total) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen35MatchesTransformers,
                         ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_5_moe-text"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Qwen35, LayerPlanAndStateFromTheConfig) {
  const model::ModelConfig c = model::load_config(fixture("qwen3_5_moe-text"));
  const model::Mixer expected[] = {model::Mixer::attention, model::Mixer::gated_deltanet,
                                   model::Mixer::gated_deltanet, model::Mixer::attention,
                                   model::Mixer::gated_deltanet, model::Mixer::attention};
  ASSERT_EQ(c.num_layers, 6);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(c.layer(i).mixer, expected[i]) << "layer " << i;
  EXPECT_EQ(c.sparse_layers(), 6);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.25);
  // conv_dim = 2 * 2 * 16 + 4 * 16 = 128 channels x (4 - 1) + 4 value heads x 16 x 16, in f32.
  EXPECT_EQ(c.deltanet.conv_dim(), 128);
  EXPECT_EQ(c.state_spec(1).recurrent_bytes, uint64_t(128 * 3 + 4 * 16 * 16) * 4);
  EXPECT_EQ(c.state_spec(1).bytes_per_token({}), 0.0);
  EXPECT_EQ(c.state_spec(1).pages(4096, 64), 0);
  EXPECT_FALSE(c.state_spec(0).recurrent());
}

// The KV cache charges each recurrent layer's state to "kv" once, whatever the capacity.
TEST(Qwen35, RecurrentStateIsInTheLedger) {
  tiering::Ledger ledger;
  const model::ModelConfig c = model::load_config(fixture("qwen3_5"));
  for (int64_t capacity : {32, 4096}) {
    engine::KVCache cache(c, capacity, ledger);
    EXPECT_EQ(cache.recurrent_bytes(), 3 * c.deltanet.state_bytes());  // layers 0..2 are linear_attention
    EXPECT_EQ(ledger.used(tiering::accounts::kv), engine::KVCache::bytes_for(c, capacity));
    EXPECT_EQ(cache.bytes(), engine::KVCache::bytes_for(c, capacity));
  }
  EXPECT_EQ(ledger.used(tiering::accounts::kv), 0u);
}

TEST(Qwen35, ChunkedPrefillEqualsWholeAndStepwise) {
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(fixture("qwen3_5_moe"), options_for(ledger));
  const std::vector<int32_t> prompt = prompt_of(fixture("qwen3_5_moe"));
  const int64_t V = w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, 32, 64);
  std::vector<float> whole(size_t(n * V));
  {
    engine::KVCache cache(w.config, 64, ledger);
    forward.run(prompt, 0, cache, whole.data(), true);
  }
  for (int64_t chunk : {1, 5, 24}) {
    engine::KVCache cache(w.config, 64, ledger);
    std::vector<float> logits(size_t(n * V));
    for (int64_t at = 0; at < n; at += chunk) {
      const int64_t len = std::min(chunk, n - at);
      forward.run(std::span(prompt).subspan(size_t(at), size_t(len)), at, cache, logits.data() + at * V, true);
    }
    double err = 0;
    for (size_t i = 0; i < logits.size(); ++i) err = std::max(err, double(std::fabs(logits[i] - whole[i])));
    EXPECT_LT(err, 1e-4) << "chunk " << chunk;
  }
}

TEST(Qwen35, BatchOfSequencesEqualsEachAlone) {
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(fixture("qwen3_5_moe-text"), options_for(ledger));
  kernels::ThreadPool pool(2);
  const int64_t V = w.config.vocab_size;
  engine::Forward f(w, pool, ledger, 32, 64);
  std::vector<int32_t> a = {5, 17, 200, 33, 4}, b = {99, 150, 7};
  engine::KVCache ca(w.config, 64, ledger), cb(w.config, 64, ledger), ca2(w.config, 64, ledger),
      cb2(w.config, 64, ledger);
  std::vector<float> la(static_cast<size_t>(V)), lb(la), ta(la), tb(la);
  f.run(a, 0, ca, la.data());
  f.run(b, 0, cb, lb.data());
  engine::BatchItem items[2] = {{a, 0, &ca2, ta.data()}, {b, 0, &cb2, tb.data()}};
  f.run_batch(items);
  // Then a decode step of both together: each continues its own recurrent state.
  const int32_t na = 11, nb = 12;
  std::vector<float> da(la), db(la), dta(la), dtb(la);
  f.run(std::span(&na, 1), 5, ca, da.data());
  f.run(std::span(&nb, 1), 3, cb, db.data());
  engine::BatchItem step[2] = {{std::span(&na, 1), 5, &ca2, dta.data()}, {std::span(&nb, 1), 3, &cb2, dtb.data()}};
  f.run_batch(step);
  for (int64_t i = 0; i < V; ++i) {
    EXPECT_NEAR(la[size_t(i)], ta[size_t(i)], 1e-4f);
    EXPECT_NEAR(lb[size_t(i)], tb[size_t(i)], 1e-4f);
    EXPECT_NEAR(da[size_t(i)], dta[size_t(i)], 1e-4f);
    EXPECT_NEAR(db[size_t(i)], dtb[size_t(i)], 1e-4f);
  }
}

// A cache that held another sequence (a reused scheduler slot) starts clean at position 0; a chunk that would skip
// or rewind the folded positions is refused before any state changes.
TEST(Qwen35, ReusedCacheStartsCleanAndGapsAreRefused) {
  tiering::Ledger ledger;
  model::ModelWeights w = model::load_model(fixture("qwen3_5"), options_for(ledger));
  kernels::ThreadPool pool(2);
  const int64_t V = w.config.vocab_size;
  engine::Forward f(w, pool, ledger, 32, 64);
  std::vector<int32_t> a = {5, 17, 200, 33, 4}, b = {99, 150, 7};
  engine::KVCache fresh(w.config, 64, ledger), reused(w.config, 64, ledger);
  std::vector<float> expected(static_cast<size_t>(V)), got(expected), scratch(expected);
  f.run(b, 0, fresh, expected.data());
  f.run(a, 0, reused, scratch.data());
  EXPECT_EQ(reused.recurrent_position(), 5);
  EXPECT_TRUE(reused.holds_prefix(5));
  EXPECT_FALSE(reused.holds_prefix(3)) << "the state holds 5 positions, not 3";
  EXPECT_THROW(f.run(b, 3, reused, got.data()), std::invalid_argument);
  EXPECT_THROW(f.run(b, 7, reused, got.data()), std::invalid_argument);
  EXPECT_EQ(reused.recurrent_position(), 5);
  f.run(b, 0, reused, got.data());
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(expected[size_t(i)], got[size_t(i)], 1e-5f);
}

// transformers 5's fused expert tensors (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) load into the
// expert tier as the per-expert ones do: the text fixture rewritten fused gives transformers' logits.
TEST(Qwen35, FusedExpertTensorsMatchTransformers) {
  const auto src = fixture("qwen3_5_moe-text");
  const model::ModelConfig c = model::load_config(src);
  const model::TensorIndex index = model::TensorIndex::open(src);
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  std::vector<test::TestTensor> tensors;
  auto bytes = [&](const std::string& name) {
    const auto data = index.data(index.at(name));
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(data.data()),
                                reinterpret_cast<const uint8_t*>(data.data()) + data.size());
  };
  for (const auto& [name, info] : index.tensors()) {
    if (name.find(".mlp.experts.") != std::string::npos) continue;
    tensors.push_back({name, "F32", info.shape, bytes(name)});
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    std::vector<uint8_t> gate_up, down;
    for (int64_t e = 0; e < E; ++e) {
      for (const char* part : {"gate_proj", "up_proj"}) {
        auto b = bytes(p + std::to_string(e) + "." + part + ".weight");
        gate_up.insert(gate_up.end(), b.begin(), b.end());
      }
      auto b = bytes(p + std::to_string(e) + ".down_proj.weight");
      down.insert(down.end(), b.begin(), b.end());
    }
    tensors.push_back({p + "gate_up_proj", "F32", {E, 2 * I, H}, gate_up});
    tensors.push_back({p + "down_proj", "F32", {E, H, I}, down});
  }
  test::TempDir dir;
  test::write_bytes(dir / "model.safetensors", test::build_file(tensors));
  std::filesystem::copy_file(src / "config.json", dir / "config.json");
  std::filesystem::copy_file(src / "reference.json", dir / "reference.json");
  const Match m = run_reference(dir.path, 64);
  EXPECT_LT(m.prompt_error, 1e-3);
  EXPECT_LT(m.step_error, 1e-3);
  EXPECT_EQ(m.greedy_matches, m.greedy_total);
}

}  // namespace
