// Gemma 4 in the mlx-community layout (runtime/model: language_model.model.* names, experts stacked as
// experts.switch_glu.{gate,up,down}_proj, router.proj at 8 bits, model_type gemma4 with the text config nested).
// Made here from the gemma4-moe and gemma4-dense transformers fixtures by MLX affine quantization (group 32: the
// experts' down_proj has 32 columns), the oracle is exact: the same fixture with every quantized tensor replaced by
// its dequantized values, in transformers' own names and fused experts, must load to identical weights. And the
// transformers-made gemma4-moe-mlx4 fixture must load to its f32 original within half a quantization step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"
#include "tests/runtime/model/mlx_quantize.h"
#include "tests/runtime/model/safetensors_writer.h"

#include "runtime/model/model.h"
#include "runtime/model/tensor_convert.h"

using namespace tierlm;

namespace {

using tierlm::fixtures::fixture;
using tierlm::fixtures::read_json;

constexpr int kGroup = 32;

test::TestTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  return {name, "F32", std::move(shape), test::bytes_of(v)};
}

// Writes DIR/mlx (MLX layout) and DIR/dequantized (transformers' names, dequantized values) from gemma4-moe.
void convert(const std::filesystem::path& out, const std::string& source) {
  const auto src = fixture(source);
  const model::TensorIndex index = model::TensorIndex::open(src);
  std::vector<test::TestTensor> mlx, hf;
  auto put_quantized = [&](const std::string& base, std::vector<int64_t> lead, int64_t rows, int64_t cols, int bits,
                           const std::vector<float>& v) {
    const test::MlxQuantized q = test::mlx_quantize(v, int64_t(v.size()) / cols, cols, bits, kGroup);
    auto shape = [&](int64_t last) {
      std::vector<int64_t> s = lead;
      s.push_back(rows);
      s.push_back(last);
      return s;
    };
    mlx.push_back({base + ".weight", "U32", shape(cols * bits / 32), test::bytes_of(q.packed)});
    mlx.push_back(f32_tensor(base + ".scales", shape(cols / kGroup), q.scales));
    mlx.push_back(f32_tensor(base + ".biases", shape(cols / kGroup), q.biases));
    return q.dequantized;
  };
  for (const auto& [name, info] : index.tensors()) {
    const std::vector<float> v = model::tensor_to_f32(index, info);
    const std::string m = "language_model." + name;
    const auto& s = info.shape;
    if (name.ends_with("experts.gate_up_proj")) {  // [E, 2I, H] -> gate [E, I, H], up [E, I, H]
      const int64_t E = s[0], I = s[1] / 2, H = s[2];
      std::vector<float> gate, up;
      for (int64_t e = 0; e < E; ++e) {
        gate.insert(gate.end(), v.begin() + e * 2 * I * H, v.begin() + e * 2 * I * H + I * H);
        up.insert(up.end(), v.begin() + e * 2 * I * H + I * H, v.begin() + (e + 1) * 2 * I * H);
      }
      const std::string p = m.substr(0, m.size() - std::strlen("gate_up_proj")) + "switch_glu.";
      const auto dg = put_quantized(p + "gate_proj", {E}, I, H, 4, gate);
      const auto du = put_quantized(p + "up_proj", {E}, I, H, 4, up);
      std::vector<float> fused;
      for (int64_t e = 0; e < E; ++e) {
        fused.insert(fused.end(), dg.begin() + e * I * H, dg.begin() + (e + 1) * I * H);
        fused.insert(fused.end(), du.begin() + e * I * H, du.begin() + (e + 1) * I * H);
      }
      hf.push_back(f32_tensor(name, s, fused));
    } else if (name.ends_with("experts.down_proj")) {
      const std::string p = m.substr(0, m.size() - std::strlen("down_proj")) + "switch_glu.";
      hf.push_back(f32_tensor(name, s, put_quantized(p + "down_proj", {s[0]}, s[1], s[2], 4, v)));
    } else if (s.size() == 2 && s[1] % kGroup == 0 && name.ends_with(".weight")) {
      const int bits = name.ends_with("router.proj.weight") ? 8 : 4;
      const std::string base = m.substr(0, m.size() - std::strlen(".weight"));
      hf.push_back(f32_tensor(name, s, put_quantized(base, {}, s[0], s[1], bits, v)));
    } else {
      mlx.push_back(f32_tensor(m, s, v));
      hf.push_back(f32_tensor(name, s, v));
    }
  }
  std::filesystem::create_directories(out / "mlx");
  std::filesystem::create_directories(out / "dequantized");
  test::write_bytes(out / "mlx/model.safetensors", test::build_file(mlx, {{"format", "mlx"}}));
  test::write_bytes(out / "dequantized/model.safetensors", test::build_file(hf));
  std::filesystem::copy_file(src / "config.json", out / "dequantized/config.json");
  boost::json::object text = read_json(src / "config.json").as_object();
  boost::json::object quant{{"group_size", kGroup}, {"bits", 4}, {"mode", "affine"}};
  for (int layer = 0; layer < 6; ++layer)
    quant[fmt::format("language_model.model.layers.{}.router.proj", layer)] =
        boost::json::object{{"group_size", kGroup}, {"bits", 8}};
  boost::json::object config{{"model_type", "gemma4"}, {"text_config", text}, {"vocab_size", text.at("vocab_size")},
                             {"tie_word_embeddings", true}, {"quantization", quant}, {"quantization_config", quant}};
  std::ofstream(out / "mlx/config.json") << boost::json::serialize(config);
}

// Largest |a - b| over every row of two matrices of one shape (dequantized by the kernels' own reader).
double max_row_diff(const kernels::WeightView& a, const kernels::WeightView& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  if (a.rows != b.rows || a.cols != b.cols) return INFINITY;
  std::vector<float> ra(static_cast<size_t>(a.cols)), rb(ra);
  double worst = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    kernels::dequantize_row(a, r, ra.data());
    kernels::dequantize_row(b, r, rb.data());
    for (size_t c = 0; c < ra.size(); ++c) worst = std::max(worst, double(std::fabs(ra[c] - rb[c])));
  }
  return worst;
}

// fn(a's views, b's views, layer, expert) for every expert of two models of one shape, read through their tiers.
template <class Fn>
void for_each_expert(const model::ModelWeights& a, const model::ModelWeights& b, Fn&& fn) {
  auto& ca = a.experts->cache();
  auto& cb = b.experts->cache();
  for (int64_t layer = 0; layer < a.config.sparse_layers(); ++layer)
    for (int32_t e = 0; e < int32_t(a.config.num_experts); ++e) {
      ca.request(layer, std::span(&e, 1));
      cb.request(layer, std::span(&e, 1));
      fn(ca.acquire(layer, e), cb.acquire(layer, e), layer, e);
      ca.release(layer, e);
      cb.release(layer, e);
    }
}

// Every matrix of `a` against `b`'s: embeddings, attention, MLP, router, per-layer inputs and every expert (read
// through each model's expert tier); returns the largest difference and counts the MLX matrices seen.
double max_weight_diff(const model::ModelWeights& a, const model::ModelWeights& b, int& mlx_matrices) {
  double worst = 0;
  auto check = [&](const kernels::Weight& x, const kernels::Weight& y) {
    if (!x.view.rows && !y.view.rows) return;
    mlx_matrices += x.view.format == kernels::WeightFormat::mlx_q4 || x.view.format == kernels::WeightFormat::mlx_q8;
    worst = std::max(worst, max_row_diff(x.view, y.view));
  };
  check(a.embed, b.embed);
  check(a.embed_per_layer, b.embed_per_layer);
  check(a.per_layer_model_projection, b.per_layer_model_projection);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    for (auto [p, q] : {std::pair{&x.qkv, &y.qkv}, {&x.o, &y.o}, {&x.gate_up, &y.gate_up}, {&x.down, &y.down},
                        {&x.router, &y.router}, {&x.per_layer_input_gate, &y.per_layer_input_gate},
                        {&x.per_layer_projection, &y.per_layer_projection}})
      check(*p, *q);
  }
  if (a.experts)
    for_each_expert(a, b, [&](const tiering::ExpertViews& va, const tiering::ExpertViews& vb, int64_t, int32_t) {
      mlx_matrices += 2 * (va.gate_up.format == kernels::WeightFormat::mlx_q4);
      worst = std::max({worst, max_row_diff(va.gate_up, vb.gate_up), max_row_diff(va.down, vb.down)});
    });
  return worst;
}

model::ModelWeights load(const std::filesystem::path& dir, tiering::Ledger& ledger) {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.packed_experts = "";
  return model::load_model(dir, o);
}

class Gemma4MlxLayout : public ::testing::TestWithParam<std::string> {};

// Exact: the MLX folder loads to exactly the weights it was quantized to, matrix by matrix and expert by expert (a
// wrong name, gate/up split, stacking, bit width or group would differ by whole quantization steps or fail to load);
// the MLX kernels themselves are checked against exact math in runtime/kernels/mlx_weights_test.
TEST_P(Gemma4MlxLayout, LoadsToItsDequantizedWeights) {
  test::TempDir dir;
  convert(dir.path, GetParam());
  tiering::Ledger ledger;
  const model::ModelWeights mlx = load(dir / "mlx", ledger), exact = load(dir / "dequantized", ledger);
  ASSERT_TRUE(mlx.config.quantization);
  EXPECT_EQ(mlx.config.quantization->bits, 4);
  for (const auto& l : mlx.layers) {
    if (l.router.view.rows) {
      EXPECT_EQ(l.router.view.bits, 8) << "router.proj at 8 bits";
    }
  }
  int matrices = 0;
  EXPECT_EQ(max_weight_diff(mlx, exact, matrices), 0.0);
  EXPECT_GT(matrices, 20);
  std::printf("[%s mlx4] %d MLX matrices equal to their dequantized values\n", GetParam().c_str(), matrices);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Gemma4MlxLayout, ::testing::Values("gemma4-moe", "gemma4-dense"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The transformers-made mlx-community fixture (tools/make_fixtures.py make_mlx_gemma4, run on the device) against
// the gemma4-moe fixture it was made from: every weight we load is within half a quantization step (plus the bf16
// rounding of its scale and bias) of the f32 original, the gate/up halves of the fused experts included. Its logits
// are not compared end to end: our MLX kernels quantize activations to int8, and on this random model a change of
// 1e-4 in one norm already flips near-tied top-2 routing (measured: post_attention_norm * (1 + 1e-4) moves the
// logits by 0.73), so only an exact-activation path could match transformers there.
TEST(Gemma4Mlx, FixtureWeightsAreTheQuantizedOriginals) {
  tiering::Ledger ledger;
  const model::ModelWeights mlx = load(fixture("gemma4-moe-mlx4"), ledger), original = load(fixture("gemma4-moe"),
                                                                                              ledger);
  EXPECT_EQ(mlx.config.model_type, "gemma4_text");
  ASSERT_EQ(mlx.layers.size(), original.layers.size());
  // 4-bit: one step is (max - min) / 15 of a group; the originals are N(0, 1/cols) draws, |w| < 1 here.
  auto bound = [](const kernels::WeightView& v) { return v.bits == 8 ? 2.0 / 255 : 1.0 / 15; };
  int matrices = 0;
  auto check = [&](const kernels::WeightView& a, const kernels::WeightView& b, const std::string& what) {
    ++matrices;
    EXPECT_LT(max_row_diff(a, b), bound(a)) << what;
  };
  check(mlx.embed.view, original.embed.view, "embed_tokens");
  for (size_t l = 0; l < mlx.layers.size(); ++l) {
    const auto &x = mlx.layers[l], &y = original.layers[l];
    check(x.qkv.view, y.qkv.view, fmt::format("layer {} qkv", l));
    check(x.o.view, y.o.view, fmt::format("layer {} o_proj", l));
    check(x.gate_up.view, y.gate_up.view, fmt::format("layer {} mlp gate/up", l));
    check(x.down.view, y.down.view, fmt::format("layer {} mlp down", l));
    check(x.router.view, y.router.view, fmt::format("layer {} router.proj", l));
    EXPECT_EQ(x.router.view.bits, 8) << "router.proj is 8-bit";
    for (size_t j = 0; j < x.router_scale.size(); ++j)
      EXPECT_NEAR(x.router_scale[j], y.router_scale[j], 1e-2 * std::fabs(y.router_scale[j])) << "router.scale";
  }
  for_each_expert(mlx, original, [&](const tiering::ExpertViews& va, const tiering::ExpertViews& vb, int64_t layer,
                                     int32_t e) {
    EXPECT_EQ(va.gate_up.format, kernels::WeightFormat::mlx_q4);
    check(va.gate_up, vb.gate_up, fmt::format("expert {}.{} gate/up", layer, e));
    check(va.down, vb.down, fmt::format("expert {}.{} down", layer, e));
  });
  std::printf("[gemma4-moe-mlx4] %d matrices within half a quantization step of gemma4-moe's\n", matrices);
}

}  // namespace
