// mlx-community layouts of gpt-oss and DeepSeek (runtime/model/mlx_matrix.h, the MLX gpt-oss expert store in
// runtime/model/moe_model.cpp), against transformers 5.17 on exactly the dequantized weights (tools/make_fixtures.py
// make_mlx_gpt_oss / make_mlx_deepseek, made on the device):
//   gpt_oss-mlx4: MXFP4 experts split by mlx-lm into mlp.experts.{gate,up,down}_proj (uint32 words, uint8 E8M0
//   scales, float .bias), affine 4-bit attention / embedding / head at group 64 and the router at 8 bits, recorded
//   per module under a top level in mode mxfp4 (what mlx-lm writes converting OpenAI's checkpoint with -q).
// Logits at every prompt position and each greedy step within 1e-3 relative, 32 greedy tokens exact, every expert
// read through the tier (as many slots as one token's top-k, no prefetch), chunked prefill and a batch; `tierlm pack`
// keeps the experts MXFP4; the slots hold byte for byte what gpt_oss-mxfp4 (OpenAI's layout of the same weights)
// gives; the planner's config-only profile sizes the slots as the tier does. DeepSeek's MLX fixtures run in
// deepseek_forward_test's suite; here: what their MLA tensors load as. A folder with a tensor renamed fails to load
// naming it; an MLX mode the kernels do not run is refused by name.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/runtime/engine/fixture_checks.h"
#include "tests/runtime/model/mlx_quantize.h"
#include "tests/runtime/model/safetensors_writer.h"

#include "calibrate/fit.h"
#include "calibrate/model_profile.h"
#include "runtime/model/model.h"
#include "runtime/model/moe_model.h"
#include "runtime/model/tensor_convert.h"

using namespace tierlm;

namespace {

using fixtures::fixture;

// Every expert use is a read: as many cache slots as one token's top-k, no prefetch; never a packed file unless given.
model::LoadOptions streaming(tiering::Ledger& ledger, const std::filesystem::path& dir,
                             const std::filesystem::path& packed = "") {
  model::LoadOptions o;
  o.ledger = &ledger;
  o.experts.cache.slots = model::load_config(dir).num_experts_per_tok;
  o.experts.cache.prefetch_limit = 0;
  o.packed_experts = packed;
  return o;
}

TEST(GptOssMlx, ConfigReadsTheModes) {
  const model::ModelConfig c = model::load_config(fixture("gpt_oss-mlx4"));
  ASSERT_TRUE(c.quantization);
  EXPECT_TRUE(c.quantization->mxfp4);
  EXPECT_TRUE(c.mxfp4_experts);
  const auto router = c.quantization->of("model.layers.0.mlp.router");
  EXPECT_EQ(router.bits, 8);
  EXPECT_FALSE(router.mxfp4) << "a module entry without a mode is affine";
  EXPECT_FALSE(c.quantization->of("model.layers.0.self_attn.q_proj").mxfp4);
  EXPECT_TRUE(c.quantization->of("model.layers.0.mlp.experts.gate_proj").mxfp4);
  // The dense modules' format for fit: most entries are affine 4-bit at group 64.
  EXPECT_EQ(calibrate::stored_weight_format(c, {}), kernels::WeightFormat::mlx_q4);
  // Modes the kernels do not run are refused by name.
  std::ifstream in(fixture("gpt_oss-mlx4") / "config.json");
  boost::json::object o = boost::json::parse(std::string(std::istreambuf_iterator<char>(in), {})).as_object();
  for (const char* mode : {"nvfp4", "mxfp8"}) {
    o["quantization"].as_object()["mode"] = mode;
    try {
      model::parse_config(boost::json::serialize(o), "config.json");
      ADD_FAILURE() << mode << " accepted";
    } catch (const model::ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + mode + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(GptOssMlx, LoadsQuantizedWithExpertsMxfp4InTheTier) {
  tiering::Ledger ledger;
  const model::ModelWeights w = model::load_model(fixture("gpt_oss-mlx4"), streaming(ledger, fixture("gpt_oss-mlx4")));
  EXPECT_EQ(w.embed.view.format, kernels::WeightFormat::mlx_q4);
  EXPECT_EQ(w.lm_head.view.format, kernels::WeightFormat::mlx_q4);
  for (const auto& l : w.layers) {
    EXPECT_EQ(l.qkv.view.format, kernels::WeightFormat::mlx_q4);
    EXPECT_EQ(l.router.view.format, kernels::WeightFormat::mlx_q8);
    EXPECT_EQ(l.sinks.size(), 4u);
    EXPECT_EQ(l.router_bias.size(), 8u);
  }
  const tiering::ExpertStore& store = w.experts->store();
  EXPECT_EQ(store.encoding(), tiering::ExpertEncoding::mlx_gpt_oss);
  const tiering::ExpertLayout& layout = store.layout();
  EXPECT_EQ(layout.format, kernels::WeightFormat::mxfp4);
  const uint64_t H = uint64_t(w.config.hidden_size), I = uint64_t(w.config.moe_intermediate_size), weights = 3 * H * I;
  EXPECT_EQ(layout.payload_bytes(), weights / 2 + weights / 32 + (2 * I + H) * 4);
  // What one miss reads from the safetensors: each projection's codes and exponents, then the three bias rows.
  EXPECT_EQ(store.extents(0, 0)[0].length, I * H / 2);
  EXPECT_EQ(store.extents(0, 0)[1].length, I * H / 32);
  EXPECT_EQ(store.extents(0, 0).size(), 9u);
  // The planner's profile from config.json alone sizes the slot as the tier does.
  const calibrate::ModelProfile p =
      calibrate::model_profile_from_config(w.config, kernels::WeightFormat::mlx_q4, kernels::WeightFormat::mxfp4);
  EXPECT_EQ(p.expert_payload_bytes, layout.payload_bytes());
  EXPECT_EQ(p.expert_bytes, layout.bytes);
}

// gpt_oss-mxfp4 holds the same experts in OpenAI's layout (the same MXFP4 codes of the same gpt_oss weights: gate_up
// rows interleaved in one tensor, *_blocks / *_scales, gate_up_proj_bias): both tiers must hold identical slots, so
// the split, the re-interleaving, the words-as-blocks reading and the bias order are exact.
TEST(GptOssMlx, SlotsEqualOpenAiLayoutsByteForByte) {
  tiering::Ledger ledger;
  const model::ModelWeights a = model::load_model(fixture("gpt_oss-mlx4"), streaming(ledger, fixture("gpt_oss")));
  const model::ModelWeights b = model::load_model(fixture("gpt_oss-mxfp4"), streaming(ledger, fixture("gpt_oss")));
  ASSERT_EQ(a.experts->store().layout().bytes, b.experts->store().layout().bytes);
  const tiering::ExpertLayout& layout = a.experts->store().layout();
  auto& ca = a.experts->cache();
  auto& cb = b.experts->cache();
  int compared = 0;
  for (int64_t layer = 0; layer < a.config.sparse_layers(); ++layer)
    for (int32_t e = 0; e < int32_t(a.config.num_experts); ++e) {
      ca.request(layer, std::span(&e, 1));
      cb.request(layer, std::span(&e, 1));
      const tiering::ExpertViews va = ca.acquire(layer, e), vb = cb.acquire(layer, e);
      for (int part : {0, 1, 3, 4, 6, 7}) {
        const uint64_t bytes = layout.parts[part].bytes;
        const void* pa = part == 0 ? va.gate_up.data : part == 1 ? va.gate_up.scales : part == 3 ? va.down.data
                         : part == 4 ? va.down.scales : part == 6 ? static_cast<const void*>(va.gate_up_bias)
                                                                   : static_cast<const void*>(va.down_bias);
        const void* pb = part == 0 ? vb.gate_up.data : part == 1 ? vb.gate_up.scales : part == 3 ? vb.down.data
                         : part == 4 ? vb.down.scales : part == 6 ? static_cast<const void*>(vb.gate_up_bias)
                                                                   : static_cast<const void*>(vb.down_bias);
        ASSERT_NE(pa, nullptr);
        EXPECT_EQ(std::memcmp(pa, pb, bytes), 0) << "expert " << layer << "." << e << " part " << part;
      }
      ++compared;
      ca.release(layer, e);
      cb.release(layer, e);
    }
  EXPECT_EQ(compared, 32);
}

TEST(GptOssMlx, LogitsAndGreedyTokensWithStreamedExperts) {
  for (int64_t chunk : {64, 1, 5}) {
    tiering::Ledger ledger;
    const model::ModelWeights w =
        model::load_model(fixture("gpt_oss-mlx4"), streaming(ledger, fixture("gpt_oss-mlx4")));
    const fixtures::ReferenceMatch m = fixtures::match_reference(w, ledger, fixture("gpt_oss-mlx4"), chunk);
    EXPECT_LT(m.prompt_error, 1e-3) << "chunk " << chunk;
    EXPECT_LT(m.step_error, 1e-3) << "chunk " << chunk;
    EXPECT_EQ(m.greedy_matches, m.greedy_total) << "chunk " << chunk;
    EXPECT_GT(w.experts->telemetry().misses, 0u);
    std::printf("[gpt_oss-mlx4 chunk %lld] prompt rel err %.2e, step rel err %.2e, greedy %d/%d, %llu expert reads\n",
                (long long)chunk, m.prompt_error, m.step_error, m.greedy_matches, m.greedy_total,
                (unsigned long long)w.experts->telemetry().misses);
  }
}

// Half of every layer's experts pinned resident (filled once at load), the rest through two slots: the same logits,
// and fewer reads than streaming everything.
TEST(GptOssMlx, ResidentSetKeepsTheLogits) {
  uint64_t streamed = 0;
  for (bool resident : {false, true}) {
    tiering::Ledger ledger;
    model::LoadOptions o = streaming(ledger, fixture("gpt_oss-mlx4"));
    if (resident)
      for (int64_t layer = 0; layer < 4; ++layer)
        for (int64_t e = 0; e < 4; ++e) o.experts.cache.resident.push_back({layer, e});
    const model::ModelWeights w = model::load_model(fixture("gpt_oss-mlx4"), o);
    const fixtures::ReferenceMatch m = fixtures::match_reference(w, ledger, fixture("gpt_oss-mlx4"), 64);
    EXPECT_LT(m.prompt_error, 1e-3);
    EXPECT_LT(m.step_error, 1e-3);
    EXPECT_EQ(m.greedy_matches, m.greedy_total);
    const uint64_t misses = w.experts->telemetry().misses;
    if (!resident) streamed = misses;
    if (resident) {
      EXPECT_LT(misses, streamed);
      std::printf("[gpt_oss-mlx4] %llu expert reads streaming all, %llu with 16 of 32 resident\n",
                  (unsigned long long)streamed, (unsigned long long)misses);
    }
  }
}

TEST(GptOssMlx, ChunkedPrefillAndBatch) {
  tiering::Ledger ledger;
  const model::ModelWeights w = fixtures::load_fixture("gpt_oss-mlx4", ledger);
  fixtures::expect_chunked_prefill_equals_whole(w, "gpt_oss-mlx4", ledger);
  fixtures::expect_batch_equals_alone(w, "gpt_oss-mlx4", ledger);
}

// `tierlm pack` keeps the MLX MXFP4 experts MXFP4 (rows interleaved, f32 biases); streamed from the packed file, one
// aligned read per miss, the logits are transformers' still.
TEST(GptOssMlx, PackedExpertsStreamTheSameLogits) {
  test::TempDir dir;
  const auto packed = model::pack_experts(fixture("gpt_oss-mlx4"), std::nullopt, dir / "experts.tierlm");
  EXPECT_EQ(tiering::read_packed_header(packed.path).layout.format, kernels::WeightFormat::mxfp4);
  tiering::Ledger ledger;
  const model::ModelWeights w =
      model::load_model(fixture("gpt_oss-mlx4"), streaming(ledger, fixture("gpt_oss-mlx4"), packed.path));
  EXPECT_EQ(w.experts->store().encoding(), tiering::ExpertEncoding::packed);
  const fixtures::ReferenceMatch m = fixtures::match_reference(w, ledger, fixture("gpt_oss-mlx4"), 64);
  EXPECT_LT(m.prompt_error, 1e-3);
  EXPECT_LT(m.step_error, 1e-3);
  EXPECT_EQ(m.greedy_matches, m.greedy_total);
  EXPECT_EQ(w.experts->telemetry().bytes_read, w.experts->telemetry().misses * packed.expert_bytes);
}

test::TestTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  return {name, "F32", std::move(shape), test::bytes_of(v)};
}

// Early mlx-lm conversions of gpt-oss (before its MXFP4 support, 2025-08) hold affine experts under the same names.
// Made here from the gpt_oss transformers fixture: DIR/mlx with the experts split and 4-bit affine (group 32) with
// their biases, everything else as stored (float: unquantized modules of an MLX folder); DIR/hf the gpt_oss folder
// with the experts replaced by exactly the dequantized values. Every expert slot dequantizes to the same rows and
// biases (the affine re-interleaving, exactly), and the two give the same logits.
TEST(GptOssMlx, AffineExpertsEqualTheirDequantizedValues) {
  const auto src = fixture("gpt_oss");
  const model::TensorIndex index = model::TensorIndex::open(src);
  const model::ModelConfig c = model::load_config(src);
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  std::vector<test::TestTensor> mlx, hf;
  // Stacked [E, rows, cols] rows quantized as one MLX module; returns the dequantized values.
  auto put = [&](const std::string& base, int64_t rows, int64_t cols, const std::vector<float>& v) {
    const test::MlxQuantized q = test::mlx_quantize(v, E * rows, cols, 4, 32);
    mlx.push_back({base + ".weight", "U32", {E, rows, cols / 8}, test::bytes_of(q.packed)});
    mlx.push_back(f32_tensor(base + ".scales", {E, rows, cols / 32}, q.scales));
    mlx.push_back(f32_tensor(base + ".biases", {E, rows, cols / 32}, q.biases));
    return q.dequantized;
  };
  for (const auto& [name, info] : index.tensors()) {
    const std::vector<float> v = model::tensor_to_f32(index, info);
    const std::string p = name.substr(0, name.rfind('.') + 1);
    if (name.ends_with("experts.gate_up_proj")) {  // [E, H, 2I] as x @ W: column 2j gate unit j, 2j + 1 up
      std::vector<float> gate(size_t(E * I * H)), up(gate.size()), fused(v.size());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t j = 0; j < I; ++j)
          for (int64_t h = 0; h < H; ++h) {
            gate[size_t((e * I + j) * H + h)] = v[size_t((e * H + h) * 2 * I + 2 * j)];
            up[size_t((e * I + j) * H + h)] = v[size_t((e * H + h) * 2 * I + 2 * j + 1)];
          }
      const auto dg = put(p + "gate_proj", I, H, gate), du = put(p + "up_proj", I, H, up);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t j = 0; j < I; ++j)
          for (int64_t h = 0; h < H; ++h) {
            fused[size_t((e * H + h) * 2 * I + 2 * j)] = dg[size_t((e * I + j) * H + h)];
            fused[size_t((e * H + h) * 2 * I + 2 * j + 1)] = du[size_t((e * I + j) * H + h)];
          }
      hf.push_back(f32_tensor(name, info.shape, fused));
    } else if (name.ends_with("experts.down_proj")) {  // [E, I, H] as x @ W: rows are its H outputs
      std::vector<float> rows(v.size()), back(v.size());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i)
          for (int64_t h = 0; h < H; ++h) rows[size_t((e * H + h) * I + i)] = v[size_t((e * I + i) * H + h)];
      const auto d = put(p + "down_proj", H, I, rows);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i)
          for (int64_t h = 0; h < H; ++h) back[size_t((e * I + i) * H + h)] = d[size_t((e * H + h) * I + i)];
      hf.push_back(f32_tensor(name, info.shape, back));
    } else if (name.ends_with("experts.gate_up_proj_bias")) {
      std::vector<float> gate, up;
      for (size_t i = 0; i < v.size(); ++i) (i % 2 ? up : gate).push_back(v[i]);
      mlx.push_back(f32_tensor(p + "gate_proj.bias", {E, I}, gate));
      mlx.push_back(f32_tensor(p + "up_proj.bias", {E, I}, up));
      hf.push_back(f32_tensor(name, info.shape, v));
    } else if (name.ends_with("experts.down_proj_bias")) {
      mlx.push_back(f32_tensor(p + "down_proj.bias", {E, H}, v));
      hf.push_back(f32_tensor(name, info.shape, v));
    } else {
      mlx.push_back(f32_tensor(name, info.shape, v));
      hf.push_back(f32_tensor(name, info.shape, v));
    }
  }
  test::TempDir dir;
  std::filesystem::create_directories(dir / "mlx");
  std::filesystem::create_directories(dir / "hf");
  test::write_bytes(dir / "mlx/model.safetensors", test::build_file(mlx, {{"format", "mlx"}}));
  test::write_bytes(dir / "hf/model.safetensors", test::build_file(hf));
  std::filesystem::copy_file(src / "config.json", dir / "hf/config.json");
  boost::json::object config = fixtures::read_json(src / "config.json").as_object();
  const boost::json::object quant{{"group_size", 32}, {"bits", 4}, {"mode", "affine"}};
  config["quantization"] = quant;
  config["quantization_config"] = quant;
  std::ofstream(dir / "mlx/config.json") << boost::json::serialize(config);

  tiering::Ledger ledger;
  const model::ModelWeights a = model::load_model(dir / "mlx", streaming(ledger, dir / "mlx"));
  const model::ModelWeights b = model::load_model(dir / "hf", streaming(ledger, dir / "hf"));
  EXPECT_FALSE(a.config.mxfp4_experts);
  EXPECT_EQ(a.experts->store().encoding(), tiering::ExpertEncoding::mlx_gpt_oss);
  EXPECT_EQ(a.experts->store().layout().format, kernels::WeightFormat::mlx_q4);
  EXPECT_EQ(a.experts->store().extents(0, 0).size(), 12u);
  auto& ca = a.experts->cache();
  auto& cb = b.experts->cache();
  double worst = 0;
  std::vector<float> ra(static_cast<size_t>(std::max(H, I))), rb(ra);
  for (int64_t layer = 0; layer < c.sparse_layers(); ++layer)
    for (int32_t e = 0; e < int32_t(E); ++e) {
      ca.request(layer, std::span(&e, 1));
      cb.request(layer, std::span(&e, 1));
      const tiering::ExpertViews va = ca.acquire(layer, e), vb = cb.acquire(layer, e);
      for (auto [x, y] : {std::pair{va.gate_up, vb.gate_up}, {va.down, vb.down}})
        for (int64_t r = 0; r < x.rows; ++r) {
          kernels::dequantize_row(x, r, ra.data());
          kernels::dequantize_row(y, r, rb.data());
          for (int64_t k = 0; k < x.cols; ++k) worst = std::max(worst, double(std::fabs(ra[size_t(k)] - rb[size_t(k)])));
        }
      for (int64_t j = 0; j < 2 * I; ++j) worst = std::max(worst, double(std::fabs(va.gate_up_bias[j] - vb.gate_up_bias[j])));
      for (int64_t j = 0; j < H; ++j) worst = std::max(worst, double(std::fabs(va.down_bias[j] - vb.down_bias[j])));
      ca.release(layer, e);
      cb.release(layer, e);
    }
  EXPECT_EQ(worst, 0.0) << "expert rows and biases";
  const std::vector<int32_t> prompt = fixtures::reference_prompt(src);
  const double logits = fixtures::max_difference(fixtures::chunked_logits(a, ledger, prompt, 64),
                                                 fixtures::chunked_logits(b, ledger, prompt, 64));
  EXPECT_LT(logits, 1e-4);
  std::printf("[gpt_oss affine mlx experts] slots equal their dequantized values, logits differ by %.2e\n", logits);
}

// DeepSeek-V3 as mlx-lm's deepseek_v3.py writes it: the attention projections stay MLX (rows reordered as stored),
// q_b_proj (input 48, not a multiple of the group) stays bf16, and the absorbed kv_b halves come from embed_q (bf16)
// and unembed_out (4-bit); V2 (deepseek_v2.py) keeps kv_b_proj, 4-bit. Both forms give the f32 kv_b halves the
// transformers fixture has, within the quantization (checked end to end by deepseek_forward_test's logits).
TEST(DeepseekMlx, MlaTensorsLoadInBothForms) {
  for (const char* name : {"deepseek_v3-mlx4", "deepseek_v2-mlx4"}) {
    tiering::Ledger ledger;
    const model::ModelWeights w = fixtures::load_fixture(name, ledger);
    const model::ModelWeights original = fixtures::load_fixture(std::string(name).substr(0, 11), ledger);
    ASSERT_EQ(w.layers.size(), original.layers.size()) << name;
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const auto &x = w.layers[i], &y = original.layers[i];
      EXPECT_EQ(x.mla_in.view.format, kernels::WeightFormat::mlx_q4) << name;
      EXPECT_EQ(x.o.view.format, kernels::WeightFormat::mlx_q4) << name;
      if (x.q_b.view.rows) {
        EXPECT_EQ(x.q_b.view.format, kernels::WeightFormat::bf16) << name;
      }
      ASSERT_EQ(x.kv_b_key.size(), y.kv_b_key.size()) << name;
      ASSERT_EQ(x.kv_b_value.size(), y.kv_b_value.size()) << name;
      double key = 0, value = 0;
      for (size_t j = 0; j < x.kv_b_key.size() / 4; ++j)
        key = std::max(key, double(std::fabs(x.kv_b_key.as<float>()[j] - y.kv_b_key.as<float>()[j])));
      for (size_t j = 0; j < x.kv_b_value.size() / 4; ++j)
        value = std::max(value, double(std::fabs(x.kv_b_value.as<float>()[j] - y.kv_b_value.as<float>()[j])));
      // 4-bit steps of N(0, 1/32) groups of 32 (about 0.05), bf16 rounding of about 0.4% for embed_q.
      EXPECT_LT(key, std::string(name) == "deepseek_v3-mlx4" ? 0.01 : 0.1) << name << " layer " << i;
      EXPECT_LT(value, 0.1) << name << " layer " << i;
      EXPECT_GT(value, 0.0) << name << " layer " << i << ": the V half is quantized";
    }
  }
}

// The planner's config-only profile of the DeepSeek MLX folders: the experts' slot as the tier holds it (MLX 4-bit,
// group 32) and the MLA latent per token and layer (kv_lora_rank + qk_rope_head_dim floats), not GQA's K and V.
TEST(DeepseekMlx, PlannerSizesExpertsAndLatentCache) {
  for (const char* name : {"deepseek_v3-mlx4", "deepseek_v2-mlx4"}) {
    tiering::Ledger ledger;
    const model::ModelWeights w = fixtures::load_fixture(name, ledger);
    EXPECT_EQ(w.experts->store().encoding(), tiering::ExpertEncoding::mlx) << name;
    EXPECT_EQ(calibrate::stored_weight_format(w.config, {}), kernels::WeightFormat::mlx_q4) << name;
    const calibrate::ModelProfile p = calibrate::model_profile_from_config(w.config, kernels::WeightFormat::mlx_q4,
                                                                           kernels::WeightFormat::mlx_q4);
    EXPECT_EQ(p.expert_bytes, w.experts->store().layout().bytes) << name;
    EXPECT_EQ(p.expert_payload_bytes, w.experts->store().layout().payload_bytes()) << name;
    ASSERT_EQ(p.layer_latent_floats.size(), 4u) << name;
    for (int64_t f : p.layer_latent_floats) EXPECT_EQ(f, 32 + 8) << name;
  }
}

// Copies a fixture's config.json and model.safetensors (no index) into `dir`, tensor `from` renamed `to` in the header.
void copy_with_renamed_tensor(const std::string& name, const std::string& from, const std::string& to,
                              const std::filesystem::path& dir) {
  std::filesystem::copy_file(fixture(name) / "config.json", dir / "config.json");
  std::ifstream in(fixture(name) / "model.safetensors", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  boost::json::object header = boost::json::parse(file.substr(8, header_bytes)).as_object();
  ASSERT_TRUE(header.contains(from)) << from;
  header[to] = header.at(from);
  header.erase(from);
  std::string text = boost::json::serialize(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += text;
  out += file.substr(8 + header_bytes);
  test::write_bytes(dir / "model.safetensors", out);
}

TEST(MlxMoeLayouts, RenamedTensorFailsToLoadNamingIt) {
  const std::pair<const char*, const char*> cases[] = {
      {"gpt_oss-mlx4", "model.layers.2.mlp.experts.up_proj.scales"},
      {"gpt_oss-mlx4", "model.layers.3.mlp.experts.down_proj.bias"},
      {"gpt_oss-mlx4", "model.layers.1.mlp.router.biases"},
      {"gpt_oss-mlx4", "model.layers.0.self_attn.sinks"},
      {"deepseek_v3-mlx4", "model.layers.2.self_attn.unembed_out.scales"},
      {"deepseek_v3-mlx4", "model.layers.1.self_attn.embed_q.weight"},
      {"deepseek_v3-mlx4", "model.layers.0.self_attn.o_proj.scales"},
      {"gpt_oss-mlx4", "model.embed_tokens.scales"},
      {"deepseek_v3-mlx4", "model.layers.3.mlp.switch_mlp.down_proj.weight"},
      {"deepseek_v2-mlx4", "model.layers.1.self_attn.kv_b_proj.biases"},
      {"deepseek_v2-mlx4", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"}};
  for (auto [name, tensor] : cases) {
    test::TempDir dir;
    copy_with_renamed_tensor(name, tensor, std::string(tensor) + "_renamed", dir.path);
    tiering::Ledger ledger;
    try {
      model::load_model(dir.path, fixtures::fixture_load_options(ledger));
      ADD_FAILURE() << name << ": loaded with " << tensor << " renamed";
    } catch (const model::ModelError& e) {
      // The message names the tensor, or (for a module's missing .scales / .biases) its module.
      const std::string what = e.what(), module = std::string(tensor).substr(0, std::string(tensor).rfind('.'));
      EXPECT_NE(what.find(module), std::string::npos) << name << " " << tensor << ": " << what;
      std::printf("[%s without %s] %s\n", name, tensor, e.what());
    }
  }
}

}  // namespace
