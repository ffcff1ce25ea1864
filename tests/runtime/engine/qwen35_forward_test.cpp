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
#include "runtime/model/moe_model.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_convert.h"

using namespace tierlm;

namespace {

using fixtures::fixture;

model::LoadOptions options_for(tiering::Ledger& ledger) {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.packed_experts = "";  // never pick up a packed file lying in the fixture folder
  return o;
}

using Match = fixtures::ReferenceMatch;

// The fixture's prompt in chunks of `chunk` tokens, then its 32 greedy steps, against reference.json.
Match run_reference(const std::filesystem::path& dir, int64_t chunk, const std::filesystem::path& packed = "") {
  tiering::Ledger ledger;
  model::LoadOptions options = options_for(ledger);
  options.packed_experts = packed;
  const model::ModelWeights w = model::load_model(dir, options);
  return fixtures::match_reference(w, ledger, dir, chunk);
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
                         // -mlx4: mlx-lm's 4-bit layout (router and shared-expert gate at 8 bits, bf16 scales),
                         // whose reference ran the dequantized weights: met because MLX weights are multiplied with
                         // f32 activations (runtime/kernels/affine_f32.h), as MLX itself does.
                         ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_5_moe-text", "qwen3_5_moe-mlx4"),
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

// Layers that run on the GPU (KVCacheOptions::first_layer, set by the Generator and the Scheduler from Forward's GPU
// layers) hold no state in the host cache: with layers 0 and 1 (Gated DeltaNet) on the GPU, "kv" holds the third
// DeltaNet layer's state and the attention layer's pages, two states fewer; every layer there: nothing. The
// recurrent position is still tracked (the GPU's states have the same rule).
TEST(Qwen35, LayersOnTheGpuHoldNoHostState) {
  tiering::Ledger ledger;
  const model::ModelConfig c = model::load_config(fixture("qwen3_5"));
  const uint64_t all = engine::KVCache::bytes_for(c, 256);
  for (int64_t first : {2, 4}) {
    engine::KVCacheOptions o;
    o.first_layer = first;
    engine::KVCache cache(c, 256, ledger, o);
    const uint64_t expected = first == 2 ? all - 2 * c.deltanet.state_bytes() : 0;
    EXPECT_EQ(engine::KVCache::bytes_for(c, 256, o), expected) << first;
    EXPECT_EQ(cache.bytes(), expected) << first;
    EXPECT_EQ(ledger.used(tiering::accounts::kv), expected) << first;
    EXPECT_EQ(cache.recurrent_bytes(), first == 2 ? c.deltanet.state_bytes() : 0u) << first;
    EXPECT_TRUE(cache.has_recurrent());
    cache.will_fold(5);
    EXPECT_FALSE(cache.can_start_at(3));
  }
}

TEST(Qwen35, ChunkedPrefillEqualsWholeAndStepwise) {
  tiering::Ledger ledger;
  const model::ModelWeights w = model::load_model(fixture("qwen3_5_moe"), options_for(ledger));
  const std::vector<int32_t> prompt = fixtures::reference_prompt(fixture("qwen3_5_moe"));
  const std::vector<float> whole = fixtures::chunked_logits(w, ledger, prompt, int64_t(prompt.size()));
  for (int64_t chunk : {1, 5, 24}) {
    const std::vector<float> chunked = fixtures::chunked_logits(w, ledger, prompt, chunk);
    EXPECT_LT(fixtures::max_difference(chunked, whole), 1e-4) << "chunk " << chunk;
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
  // tierlm pack reads the fused tensors too: the packed experts give the same logits.
  const auto packed = model::pack_experts(dir.path, kernels::WeightFormat::f32, dir / "experts.tierlm");
  EXPECT_EQ(packed.experts, c.num_layers * E);
  const Match p = run_reference(dir.path, 64, packed.path);
  EXPECT_LT(p.prompt_error, 1e-3);
  EXPECT_LT(p.step_error, 1e-3);
  EXPECT_EQ(p.greedy_matches, p.greedy_total);
}

// bf16 round-to-nearest-even of an f32, as torch's .to(torch.bfloat16) rounds.
uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Writes the same weights twice: in mlx-lm's layout (what tests/fixtures/models/qwen3_5_moe-mlx4 holds) quantized
// with MLX affine math (bf16 scales and biases), and as a transformers f32 folder holding exactly the dequantized
// values, so the two must give the same logits.
struct MlxPair {
  std::vector<test::TestTensor> mlx, hf;
};

void add_quantized(MlxPair& out, const std::string& mlx_base, const std::string& hf_name, const float* w,
                   std::vector<int64_t> shape, int bits) {
  const int64_t cols = shape.back(), group = 64, per = 32 / bits, levels = (1 << bits) - 1;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  std::vector<uint32_t> packed(size_t(rows * cols / per), 0);
  std::vector<uint16_t> scales(size_t(rows * cols / group)), biases(scales.size());
  std::vector<float> dequantized(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / group; ++g) {
      const float* x = w + r * cols + g * group;
      const float lo = *std::min_element(x, x + group), hi = *std::max_element(x, x + group);
      const size_t at = size_t(r * (cols / group) + g);
      scales[at] = bf16_bits(std::max((hi - lo) / float(levels), 1e-8f));
      biases[at] = bf16_bits(lo);
      const float scale = bf16_value(scales[at]), bias = bf16_value(biases[at]);
      for (int64_t j = 0; j < group; ++j) {
        const int64_t c = g * group + j;
        const int64_t q = std::clamp<int64_t>(std::llround((x[j] - bias) / scale), 0, levels);
        packed[size_t((r * cols + c) / per)] |= uint32_t(q) << (bits * (c % per));
        dequantized[size_t(r * cols + c)] = float(q) * scale + bias;
      }
    }
  std::vector<int64_t> packed_shape = shape, group_shape = shape;
  packed_shape.back() = cols / per;
  group_shape.back() = cols / group;
  out.mlx.push_back({mlx_base + ".weight", "U32", packed_shape, test::bytes_of(packed)});
  out.mlx.push_back({mlx_base + ".scales", "BF16", group_shape, test::bytes_of(scales)});
  out.mlx.push_back({mlx_base + ".biases", "BF16", group_shape, test::bytes_of(biases)});
  out.hf.push_back({hf_name, "F32", shape, test::bytes_of(dequantized)});
}

// A float tensor stored bf16 by mlx-lm (`shift`: the (1 + w) norms stored as w + 1); the transformers copy holds the
// same values back in f32.
void add_float(MlxPair& out, const std::string& mlx_name, const std::string& hf_name, std::vector<float> w,
               std::vector<int64_t> mlx_shape, std::vector<int64_t> hf_shape, float shift) {
  std::vector<uint16_t> stored(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    stored[i] = bf16_bits(w[i] + shift);
    w[i] = bf16_value(stored[i]) - shift;
  }
  out.mlx.push_back({mlx_name, "BF16", mlx_shape, test::bytes_of(stored)});
  out.hf.push_back({hf_name, "F32", hf_shape, test::bytes_of(w)});
}

}  // namespace

// mlx-lm's layout (language_model.model.* names, conv1d [C, K, 1], norms stored + 1, stacked switch_mlp experts,
// the router and shared-expert gate at 8 bits through per-module "quantization" entries, bf16 scales and biases,
// A_log f32), written here from the qwen3_5_moe fixture's weights, against a transformers f32 folder holding exactly
// the dequantized values: every weight the engine loads must be the same. (The logits of such a folder are checked
// against transformers through the qwen3_5_moe-mlx4 fixture above.)
TEST(Qwen35, MlxLayoutLoadsTheSameWeightsAsTheTransformersLayout) {
  const auto src = fixture("qwen3_5_moe");
  const model::ModelConfig c = model::load_config(src);
  const model::TensorIndex index = model::TensorIndex::open(src);
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  MlxPair pair;
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  const std::string hf_prefix = "model.language_model.";
  for (const auto& [name, info] : index.tensors()) {
    if (name.rfind(hf_prefix, 0) != 0 && name != "lm_head.weight") continue;  // vision tower, mtp
    if (name.find(".mlp.experts.") != std::string::npos) continue;            // stacked below
    const std::string mlx = name == "lm_head.weight" ? "language_model.lm_head.weight"
                                                     : "language_model.model." + name.substr(hf_prefix.size());
    const std::vector<float> w = model::tensor_to_f32(index, info);
    if (ends_with(name, "conv1d.weight")) {
      add_float(pair, mlx, name, w, {info.shape[0], info.shape[2], 1}, info.shape, 0.0f);
    } else if (ends_with(name, "A_log")) {
      pair.mlx.push_back({mlx, "F32", info.shape, test::bytes_of(w)});
      pair.hf.push_back({name, "F32", info.shape, test::bytes_of(w)});
    } else if (info.shape.size() == 2 && info.shape[1] % 64 == 0) {
      const bool eight = ends_with(name, "mlp.gate.weight") || ends_with(name, "shared_expert_gate.weight");
      add_quantized(pair, mlx.substr(0, mlx.size() - 7), name, w.data(), info.shape, eight ? 8 : 4);
    } else {
      const bool shifted = ends_with(name, "layernorm.weight") || ends_with(name, "q_norm.weight") ||
                           ends_with(name, "k_norm.weight") || name == hf_prefix + "norm.weight";
      add_float(pair, mlx, name, w, info.shape, info.shape, shifted ? 1.0f : 0.0f);
    }
  }
  // Experts: per-expert HF tensors -> switch_mlp.{gate,up,down}_proj [E, out, in], quantized per row.
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string hf = hf_prefix + "layers." + std::to_string(l) + ".mlp.";
    const std::string mlx = "language_model.model.layers." + std::to_string(l) + ".mlp.switch_mlp.";
    for (auto [part, rows, cols] : {std::tuple{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}}) {
      std::vector<float> stacked;
      for (int64_t e = 0; e < E; ++e) {
        const auto w = model::tensor_to_f32(index, index.at(hf + "experts." + std::to_string(e) + "." + part + ".weight"));
        stacked.insert(stacked.end(), w.begin(), w.end());
      }
      MlxPair one;
      add_quantized(one, mlx + part, "stacked", stacked.data(), {E, rows, cols}, 4);
      pair.mlx.insert(pair.mlx.end(), one.mlx.begin(), one.mlx.end());
      const auto* deq = reinterpret_cast<const float*>(one.hf.front().bytes.data());
      for (int64_t e = 0; e < E; ++e) {
        std::vector<float> w(deq + e * rows * cols, deq + (e + 1) * rows * cols);
        pair.hf.push_back({hf + "experts." + std::to_string(e) + "." + part + ".weight", "F32", {rows, cols},
                           test::bytes_of(w)});
      }
    }
  }
  test::TempDir mlx_dir, hf_dir;
  test::write_bytes(mlx_dir / "model.safetensors", test::build_file(pair.mlx, {{"format", "mlx"}}));
  test::write_bytes(hf_dir / "model.safetensors", test::build_file(pair.hf));
  std::filesystem::copy_file(fixture("qwen3_5_moe-mlx4") / "config.json", mlx_dir / "config.json");
  std::filesystem::copy_file(src / "config.json", hf_dir / "config.json");

  // Every weight the forward pass reads, dequantized, equals the transformers folder's: matrices row by row,
  // norms (the +1 undone), conv taps, decay and dt_bias, and every expert of every layer through the expert tier.
  tiering::Ledger ledger;
  model::ModelWeights m = model::load_model(mlx_dir.path, options_for(ledger));
  model::ModelWeights h = model::load_model(hf_dir.path, options_for(ledger));
  EXPECT_EQ(m.layers[0].router.view.format, kernels::WeightFormat::mlx_q8) << "per-module 8 bits";
  EXPECT_EQ(m.layers[0].linear_in.view.format, kernels::WeightFormat::mlx_q4);
  double worst = 0;
  auto rows_equal = [&](const kernels::WeightView& a, const kernels::WeightView& b) {
    ASSERT_EQ(a.rows, b.rows);
    ASSERT_EQ(a.cols, b.cols);
    std::vector<float> ra(size_t(a.cols)), rb(size_t(b.cols));
    for (int64_t r = 0; r < a.rows; ++r) {
      kernels::dequantize_row(a, r, ra.data());
      kernels::dequantize_row(b, r, rb.data());
      for (size_t j = 0; j < ra.size(); ++j) worst = std::max(worst, double(std::fabs(ra[j] - rb[j])));
    }
  };
  auto equal = [&](const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::fabs(a[j] - b[j])));
  };
  rows_equal(m.embed.view, h.embed.view);
  rows_equal(m.output(), h.output());
  equal(m.final_norm, h.final_norm);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const model::LayerWeights &a = m.layers[l], &b = h.layers[l];
    for (auto [x, y] : {std::pair{&a.qkv, &b.qkv}, {&a.linear_in, &b.linear_in}, {&a.o, &b.o},
                        {&a.router, &b.router}, {&a.shared_gate_up, &b.shared_gate_up},
                        {&a.shared_down, &b.shared_down}})
      if (y->view.rows) rows_equal(x->view, y->view);
    for (auto [x, y] : {std::pair{&a.input_norm, &b.input_norm}, {&a.post_attention_norm, &b.post_attention_norm},
                        {&a.q_norm, &b.q_norm}, {&a.k_norm, &b.k_norm}, {&a.conv, &b.conv},
                        {&a.decay_rate, &b.decay_rate}, {&a.dt_bias, &b.dt_bias}, {&a.gated_norm, &b.gated_norm},
                        {&a.shared_expert_gate, &b.shared_expert_gate}})
      equal(*x, *y);
    for (int32_t e = 0; e < int32_t(E); ++e) {
      const std::vector<int32_t> one = {e};
      for (auto* w : {&m, &h}) w->experts->cache().request(int64_t(l), one);
      const tiering::ExpertViews x = m.experts->cache().acquire(int64_t(l), e);
      const tiering::ExpertViews y = h.experts->cache().acquire(int64_t(l), e);
      rows_equal(x.gate_up, y.gate_up);
      rows_equal(x.down, y.down);
      m.experts->cache().release(int64_t(l), e);
      h.experts->cache().release(int64_t(l), e);
    }
  }
  EXPECT_LT(worst, 1e-6) << "a weight of the mlx layout differs from the transformers layout's";
  std::printf("[qwen3_5_moe mlx layout] worst weight difference vs the f32 folder of the same values: %.2e\n", worst);
}
