// Gemma 4's config (gemma4_text, and gemma4 with a nested text_config) expanded into LayerSpecs, checked against
// what transformers 5.17 builds from the same keys: Gemma4TextConfig.__post_init__ (default layer_types 5:1 with the
// last layer forced to full attention, per_layer_config derived from global_head_dim / num_global_key_value_heads),
// Gemma4TextAttention (k_eq_v on full layers only, KV sharing from layer L - num_kv_shared_layers on, reading the last
// earlier layer of the same type), Gemma4TextMLP (double-wide only on KV-shared layers). The fixtures' own configs are
// the ones transformers wrote; options tierlm does not compute are load errors naming them.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "calibrate/model_profile.h"
#include "calibrate/planner.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/model/config.h"
#include "tiering/ledger.h"

using namespace tierlm;
using namespace tierlm::model;

namespace {

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / name;
}

// A 6-layer gemma4_text config left open for more keys (close it with with()).
const std::string kBase = R"({"model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 16, "hidden_size_per_layer_input": 0)";

std::string with(const std::string& extra) { return kBase + (extra.empty() ? "" : ", " + extra) + "}"; }

std::string error_of(const std::string& json) {
  try {
    parse_config(json, "x/config.json");
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

template <class Field>
std::vector<int64_t> per_layer(const ModelConfig& c, Field f) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.num_layers; ++i) out.push_back(int64_t(f(c.layer(i))));
  return out;
}

TEST(Gemma4Config, MoeFixtureLayerPlan) {
  const ModelConfig c = load_config(fixture("gemma4-moe"));
  EXPECT_TRUE(c.arch.gemma4);
  EXPECT_TRUE(c.arch.moe);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.embedding_scale, 8.0);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(c.attention_scale, 1.0);
  EXPECT_EQ(c.per_layer_input_size, 0);
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.window; }), (std::vector<int64_t>{8, 8, 8, 8, 8, 0}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.head_dim; }),
            (std::vector<int64_t>{16, 16, 16, 16, 16, 32}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.kv_heads; }), (std::vector<int64_t>{2, 2, 2, 2, 2, 1}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.k_eq_v; }), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.kv_source; }),
            (std::vector<int64_t>{-1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.expert_layer; }),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  ASSERT_TRUE(c.full_attention_rope);
  EXPECT_EQ(c.full_attention_rope->type, "proportional");
  EXPECT_DOUBLE_EQ(c.full_attention_rope->partial_rotary_factor, 0.25);
  EXPECT_DOUBLE_EQ(c.full_attention_rope->theta, 1e6);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e4);
  EXPECT_EQ(&c.rope_of(5), &*c.full_attention_rope);
  EXPECT_EQ(&c.rope_of(0), &c.rope);
}

TEST(Gemma4Config, DenseFixtureSharesKvAndWidensTheSharedLayersMlp) {
  const ModelConfig c = load_config(fixture("gemma4-dense"));
  EXPECT_FALSE(c.arch.moe);
  EXPECT_EQ(c.per_layer_input_size, 16);
  EXPECT_EQ(c.per_layer_vocab_size, 256);
  // layer_types s,s,f,s,s,f with num_kv_shared_layers 3: layers 3, 4 (sliding) read layer 1, layer 5 (full) layer 2.
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.kv_source; }), (std::vector<int64_t>{-1, -1, -1, 1, 1, 2}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.intermediate; }),
            (std::vector<int64_t>{96, 96, 96, 192, 192, 192}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.head_dim; }),
            (std::vector<int64_t>{16, 16, 32, 16, 16, 32}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.kv_heads; }), (std::vector<int64_t>{2, 2, 2, 2, 2, 2}));
  // KV-shared layers hold no state of their own: the cache is the three storing layers' pages, all in the ledger.
  for (int64_t i = 3; i < 6; ++i) EXPECT_EQ(c.state_spec(i).page_bytes(kv::layout_for(kv::Codec::f32, 16)), 0u);
  tiering::Ledger ledger;
  engine::KVCacheOptions f32;
  f32.codec = kv::Codec::f32;
  engine::KVCache cache(c, 64, ledger, f32);
  uint64_t own = 0;
  for (int64_t i = 0; i < 3; ++i)
    own += c.state_spec(i).bytes(kv::layout_for(kv::Codec::f32, int(c.layer(i).head_dim)), 64, 64);
  EXPECT_EQ(cache.bytes(), own);
  EXPECT_EQ(ledger.used(tiering::accounts::kv), own);
  EXPECT_EQ(engine::KVCache::bytes_for(c, 64, f32), own);
}

TEST(Gemma4Config, ConditionalGenerationReadsTheTextConfig) {
  const ModelConfig c = load_config(fixture("gemma4-cg"));
  EXPECT_EQ(c.model_type, "gemma4_text");
  EXPECT_TRUE(c.arch.gemma4);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.layer(5).head_dim, 32);
}

TEST(Gemma4Config, DefaultsAsTheConfigClassDerivesThem) {
  // No layer_types: 5 sliding : 1 full, window 512; no per_layer_config: full layers take global_head_dim (default
  // 512) and, with attention_k_eq_v, num_global_key_value_heads.
  ModelConfig c = parse_config(with(R"("attention_k_eq_v": true, "num_global_key_value_heads": 1,
                                       "global_head_dim": 64)"), "c");
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.window; }),
            (std::vector<int64_t>{512, 512, 512, 512, 512, 0}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.head_dim; }),
            (std::vector<int64_t>{16, 16, 16, 16, 16, 64}));
  EXPECT_EQ(per_layer(c, [](const LayerSpec& l) { return l.kv_heads; }), (std::vector<int64_t>{2, 2, 2, 2, 2, 1}));
  // Without k_eq_v the global KV head count is not applied (the config class gates it on attention_k_eq_v).
  c = parse_config(with(R"("num_global_key_value_heads": 1)"), "c");
  EXPECT_EQ(c.layer(5).kv_heads, 2);
  EXPECT_EQ(c.layer(5).head_dim, 512);
  EXPECT_FALSE(c.layer(5).k_eq_v);
  // The last layer is always full attention; PLE defaults to 256 when the key is absent.
  c = parse_config(R"({"model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "layer_types": ["sliding_attention", "sliding_attention"]})", "c");
  EXPECT_EQ(c.layer(1).window, 0);
  EXPECT_EQ(c.layer(0).window, 512);
  EXPECT_EQ(c.per_layer_input_size, 256);
}

TEST(Gemma4Config, UnsupportedOptionsAreErrorsNamingThem) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("use_bidirectional_attention": "all")", "use_bidirectional_attention"},
      {R"("attention_bias": true)", "attention_bias"},
      {R"("hidden_activation": "silu")", "hidden_activation"},
      {R"("num_kv_shared_layers": 6)", "num_kv_shared_layers"},
      // Layer 5 (full) would share KV, but layers [0, 5) hold no full-attention layer.
      {R"("num_kv_shared_layers": 1)", "num_kv_shared_layers"},
      {R"("per_layer_config": {"5": {"head_dim": 32, "sliding_window": 4}})", "sliding_window"},
      {R"("per_layer_config": {"9": {"head_dim": 32}})", "per_layer_config"},
      {R"("rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default"}})", "rope_type"},
      {R"("rope_parameters": {"full_attention": {"rope_type": "default"}})", "sliding_attention"},
      {R"("enable_moe_block": true, "num_experts": 4)", "top_k_experts"},
      {R"("attn_logit_softcapping": 50.0)", "attn_logit_softcapping"},
  };
  for (const auto& [extra, name] : cases) {
    const std::string e = error_of(with(extra));
    EXPECT_NE(e.find(name), std::string::npos) << extra << " -> '" << e << "'";
  }
  EXPECT_EQ(error_of(with(R"("use_bidirectional_attention": null, "num_kv_shared_layers": 0)")), "");
}

// The GPU backend runs Gemma 4's block (gpu_reference_test checks it against transformers); what it refuses, it
// names: heads wider than its attention kernels take (global_head_dim 512, the default, on full layers), and a
// KV-shared layer left on the CPU whose source layer would be on the GPU (the host KV cache would not hold its keys).
TEST(Gemma4Config, GpuRunsTheBlockAndRefusesWhatItCannotByName) {
  for (const char* name : {"gemma4-dense", "gemma4-moe", "gemma4-cg"}) {
    const ModelConfig c = load_config(fixture(name));
    EXPECT_NO_THROW(gpu::GpuLayers::check_supported(c, c.num_layers)) << name;
    EXPECT_NO_THROW(gpu::GpuLayers::check_supported(c, 1)) << name;
    EXPECT_NO_THROW(gpu::GpuLayers::check_supported(c, 0)) << name;
  }
  auto refusal = [](const ModelConfig& c, int64_t layers) -> std::string {
    try {
      gpu::GpuLayers::check_supported(c, layers);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  // gemma4-dense: layers 3 and 4 read layer 1's KV, layer 5 layer 2's.
  const ModelConfig dense = load_config(fixture("gemma4-dense"));
  ASSERT_EQ(dense.layer(4).kv_source, 1);
  for (int64_t layers : {2, 3, 4, 5}) {
    const std::string e = refusal(dense, layers);
    EXPECT_NE(e.find("num_kv_shared_layers"), std::string::npos) << layers << ": '" << e << "'";
  }
  const ModelConfig wide = parse_config(with(""), "c");  // full layer 5: global_head_dim 512
  ASSERT_EQ(wide.layer(5).head_dim, 512);
  EXPECT_NE(refusal(wide, 6).find("head_dim 512"), std::string::npos) << refusal(wide, 6);
  EXPECT_EQ(refusal(wide, 5), "");
}

}  // namespace

// The planner's KV arithmetic (kv_sequence_bytes: the plan, serving_fit, fit) takes each layer's own shape, as the KV
// cache does: the full-attention layers' head size and KV heads, windowed layers bounded, KV-shared layers holding
// none; and the profile keeps the per-layer shapes through its JSON form (the wisdom file). Before, the planner used
// the model-wide head size and KV heads for every layer.
TEST(Gemma4Config, PlannerCountsEachLayersKvShapeAsTheKvCacheDoes) {
  for (const char* name : {"gemma4-moe", "gemma4-dense"}) {
    const ModelConfig c = load_config(std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / name);
    const auto profile =
        calibrate::model_profile_from_config(c, kernels::WeightFormat::f32, kernels::WeightFormat::f32);
    const auto reread = calibrate::model_profile_from_json(calibrate::to_json(profile));
    ASSERT_EQ(reread.layer_head_dims.size(), size_t(c.num_layers)) << name;
    for (const char* codec : {"f32", "f16", "q8"})
      for (int64_t context : {256, 32768}) {
        engine::KVCacheOptions o;
        o.codec = kv::parse_codec(codec);
        o.max_chunk = 64;
        EXPECT_EQ(calibrate::kv_sequence_bytes(reread, codec, context, 64), engine::KVCache::bytes_for(c, context, o))
            << name << " " << codec << " " << context;
      }
  }
}
