// Qwen3.5 configs (transformers 5.17 configuration_qwen3_5*.py) as the per-layer description reads them: layer_types
// with linear_attention / full_attention, or full_attention_interval when layer_types is absent ("linear_attention"
// iff (i + 1) % interval != 0, Qwen3_5TextConfig.__post_init__), the nested text_config and the text-only configs,
// partial_rotary_factor (default 0.25) and the linear_* sizes; what the engine does not implement (attention_bias,
// another layer type) is refused by name. Plus partial RoPE against exact math and mlx-lm's per-module quantization.
#include <cmath>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/engine/ops.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/model/config.h"
#include "runtime/model/config_keys.h"
#include "runtime/model/safetensors.h"

using namespace tierlm::model;

namespace {

std::string text_config(const std::string& model_type, const std::string& extra) {
  return R"({"model_type": ")" + model_type + R"(", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_value_head_dim": 16)" + (extra.empty() ? "" : ", " + extra) + "}";
}

std::string error_of(const std::string& json) {
  try {
    parse_config(json, "x/config.json");
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Qwen35Config, FullAttentionIntervalWithoutLayerTypes) {
  const ModelConfig c = parse_config(text_config("qwen3_5_text", R"("full_attention_interval": 4)"), "c");
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(c.layer(i).mixer, (i + 1) % 4 ? Mixer::gated_deltanet : Mixer::attention) << i;
  const ModelConfig every3 = parse_config(text_config("qwen3_5_text", R"("full_attention_interval": 3)"), "c");
  EXPECT_EQ(every3.layer(2).mixer, Mixer::attention);
  EXPECT_EQ(every3.layer(3).mixer, Mixer::gated_deltanet);
  // Default interval 4 and partial_rotary_factor 0.25, as the config class defaults them.
  const ModelConfig d = parse_config(text_config("qwen3_5_text", ""), "c");
  EXPECT_EQ(d.layer(3).mixer, Mixer::attention);
  EXPECT_EQ(d.layer(0).mixer, Mixer::gated_deltanet);
  EXPECT_DOUBLE_EQ(d.rope.partial_rotary_factor, 0.25);
  EXPECT_TRUE(d.arch.attention_output_gate);
  EXPECT_TRUE(d.arch.zero_centred_norms);
  EXPECT_EQ(d.deltanet.conv_dim(), 2 * 2 * 16 + 4 * 16);
  EXPECT_EQ(d.state_spec(0).recurrent_bytes, uint64_t(128 * 3 + 4 * 16 * 16) * 4);
}

TEST(Qwen35Config, NestedTextConfigAndRopeParameters) {
  const std::string nested = R"({"model_type": "qwen3_5_moe", "tie_word_embeddings": false, "vision_config": {},
    "image_token_id": 5, "text_config": )" +
                             text_config("qwen3_5_moe_text", R"("num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": true})") + "}";
  const ModelConfig c = parse_config(nested, "c");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.layer(1).mixer, Mixer::attention);
  EXPECT_EQ(c.layer(7).mixer, Mixer::attention);
  EXPECT_EQ(c.layer(6).mixer, Mixer::gated_deltanet);
  EXPECT_EQ(c.sparse_layers(), 8);
  EXPECT_TRUE(c.arch.moe_renormalize) << "Qwen3_5MoeTopKRouter always renormalizes its top-k";
  EXPECT_TRUE(c.arch.shared_expert);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
}

TEST(Qwen35Config, UnimplementedOptionsAreRefusedByName) {
  EXPECT_NE(error_of(text_config("qwen3_5_text", R"("attention_bias": true)")).find("'attention_bias'"),
            std::string::npos);
  EXPECT_EQ(error_of(text_config("qwen3_5_text", R"("attention_bias": false)")), "");
  const std::string e = error_of(text_config("qwen3_5_text", R"("layer_types": ["linear_attention",
    "sliding_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
    "full_attention"])"));
  EXPECT_NE(e.find("'layer_types'"), std::string::npos) << e;
  EXPECT_NE(e.find("sliding_attention"), std::string::npos) << e;
  EXPECT_NE(error_of(text_config("qwen3_5_text", R"("full_attention_interval": 0)")).find("full_attention_interval"),
            std::string::npos);
  // linear_num_value_heads must be a multiple of the key heads (repeat_interleave shares key heads).
  std::string bad = text_config("qwen3_5_text", "");
  bad.replace(bad.find(R"("linear_num_value_heads": 4)"), 27, R"("linear_num_value_heads": 3)");
  EXPECT_NE(error_of(bad).find("'linear_num_value_heads'"), std::string::npos) << error_of(bad);
  // A missing DeltaNet size is named.
  std::string missing = text_config("qwen3_5_text", "");
  missing.replace(missing.find(R"("linear_conv_kernel_dim": 4,)"), 28, "");
  EXPECT_NE(error_of(missing).find("'linear_conv_kernel_dim'"), std::string::npos) << error_of(missing);
  // Other families still refuse partial_rotary_factor (they do not implement it).
  const std::string llama = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "partial_rotary_factor": 0.5})";
  EXPECT_NE(error_of(llama).find("'partial_rotary_factor'"), std::string::npos);
}

// The GPU backend runs Gated DeltaNet layers (layers 0-2 here, full_attention_interval 4) within its kernels' limits
// and names the limit it refuses; the gated full-attention layers (layer 3: output gate, partial rotary) run
// (gpu_reference_test holds both to transformers), unless their q/k/v carry biases.
TEST(Qwen35Config, GpuBackendRunsDeltaNetAndGatedAttention) {
  const ModelConfig c = parse_config(text_config("qwen3_5_text", ""), "c");
  ASSERT_EQ(c.layer(2).mixer, Mixer::gated_deltanet);
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(c, 3));
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(c, c.num_layers));
  std::string wide = text_config("qwen3_5_text", "");
  wide.replace(wide.find(R"("linear_key_head_dim": 16)"), 25, R"("linear_key_head_dim": 2048)");
  try {
    tierlm::gpu::GpuLayers::check_supported(parse_config(wide, "c"), 1);
    ADD_FAILURE() << "no refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Gated DeltaNet layer with linear_conv_kernel_dim 4, linear_key_head_dim 2048"),
              std::string::npos) << e.what();
  }
  ModelConfig attention_only = c;
  for (auto& l : attention_only.layers) l.mixer = Mixer::attention;
  ASSERT_TRUE(attention_only.arch.attention_output_gate);
  ASSERT_LT(attention_only.rope.partial_rotary_factor, 1.0);
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(attention_only, 1));
  attention_only.arch.qkv_bias = true;
  try {
    tierlm::gpu::GpuLayers::check_supported(attention_only, 1);
    ADD_FAILURE() << "no refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gated attention with q/k/v biases"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(c, 0));
}

TEST(Qwen35Config, MlxPerModuleQuantization) {
  const std::string mlx = R"({"model_type": "qwen3_5_moe", "quantization": {"group_size": 64, "bits": 4,
    "mode": "affine", "language_model.model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}},
    "text_config": )" + text_config("qwen3_5_moe_text", R"("num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32)") + "}";
  const ModelConfig c = parse_config(mlx, "c");
  ASSERT_TRUE(c.quantization);
  EXPECT_EQ(c.quantization->of("language_model.model.layers.0.mlp.gate").bits, 8);
  EXPECT_EQ(c.quantization->of("language_model.model.layers.1.mlp.gate").bits, 4);
  std::string bad = mlx;
  bad.replace(bad.find(R"("bits": 8)"), 9, R"("bits": 3)");
  EXPECT_NE(error_of(bad).find("'bits'"), std::string::npos) << error_of(bad);
}

// Partial RoPE: the first head_dim * factor dims rotate as a full RoPE of that width would (rotate_half pairs
// (j, j + rotary/2), frequencies theta^(-2j/rotary)); the rest pass through.
TEST(Qwen35Config, PartialRopeRotatesOnlyTheRotaryDims) {
  RopeConfig rope;
  rope.theta = 1e6;
  rope.partial_rotary_factor = 0.25;
  const tierlm::engine::Rope partial(rope, 32);
  std::vector<float> x(32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.1f - 1.0f;
  std::vector<float> y = x;
  const int64_t pos = 7;
  partial.apply(y.data(), 1, pos);
  for (int64_t j = 0; j < 4; ++j) {  // rotary 8: pairs (j, j + 4)
    const double angle = double(pos) * std::pow(1e6, -double(2 * j) / 8.0);
    EXPECT_NEAR(y[size_t(j)], x[size_t(j)] * std::cos(angle) - x[size_t(j + 4)] * std::sin(angle), 1e-5);
    EXPECT_NEAR(y[size_t(j + 4)], x[size_t(j + 4)] * std::cos(angle) + x[size_t(j)] * std::sin(angle), 1e-5);
  }
  for (size_t i = 8; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

// The planner's KV arithmetic (calibrate: kv_sequence_bytes, used by the plan, serving_fit and /wisdom) counts each
// DeltaNet layer's fixed state exactly as the KV cache allocates it, at any context, and the profile keeps it through
// its JSON form (the wisdom file).
TEST(Qwen35Config, PlannerCountsRecurrentStateAsTheKvCacheDoes) {
  const ModelConfig c = load_config(std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/qwen3_5_moe");
  const auto profile = tierlm::calibrate::model_profile_from_config(c, tierlm::kernels::WeightFormat::f32,
                                                                    tierlm::kernels::WeightFormat::f32);
  const auto reread = tierlm::calibrate::model_profile_from_json(tierlm::calibrate::to_json(profile));
  ASSERT_EQ(reread.layer_recurrent_bytes.size(), 4u);
  EXPECT_EQ(reread.layer_recurrent_bytes[0], c.deltanet.state_bytes());
  EXPECT_EQ(reread.layer_recurrent_bytes[3], 0u);
  for (int64_t context : {256, 32768}) {
    tierlm::engine::KVCacheOptions o;
    o.codec = tierlm::kv::Codec::f16;
    o.max_chunk = 64;
    EXPECT_EQ(tierlm::calibrate::kv_sequence_bytes(reread, "f16", context, 64),
              tierlm::engine::KVCache::bytes_for(c, context, o))
        << context;
  }
  // Only the one full-attention layer (layer 3) grows with the context.
  const auto layout = tierlm::kv::layout_for(tierlm::kv::Codec::f16, int(c.head_dim));
  EXPECT_EQ(tierlm::calibrate::kv_sequence_bytes(reread, "f16", 32768, 64) -
                tierlm::calibrate::kv_sequence_bytes(reread, "f16", 256, 64),
            c.state_spec(3).bytes(layout, 32768, 64) - c.state_spec(3).bytes(layout, 256, 64));
}

// The Qwen3.5 fixtures' configs (outer and text_config) carry only keys the families read or bookkeeping keys.
TEST(Qwen35Config, FixtureConfigsCarryNoUnreadKey) {
  for (const char* name : {"qwen3_5", "qwen3_5_moe", "qwen3_5_moe-text", "qwen3_5_moe-mlx4"}) {
    const auto dir = std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / name;
    std::ifstream in(dir / "config.json");
    std::stringstream text;
    text << in.rdbuf();
    const auto json = boost::json::parse(text.str()).as_object();
    const ArchitectureSpec* arch = find_architecture(std::string(json.at("model_type").as_string()));
    ASSERT_NE(arch, nullptr) << name;
    EXPECT_TRUE(unread_config_keys(json, *arch).empty()) << name;
    if (json.contains("text_config")) {
      const auto& inner = json.at("text_config").as_object();
      const ArchitectureSpec* text_arch = find_architecture(std::string(inner.at("model_type").as_string()));
      ASSERT_NE(text_arch, nullptr) << name;
      const auto unread = unread_config_keys(inner, *text_arch);
      EXPECT_TRUE(unread.empty()) << name << ": " << (unread.empty() ? "" : unread.front());
    }
    EXPECT_NO_THROW(load_config(dir)) << name;
  }
}
