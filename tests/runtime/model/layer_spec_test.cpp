// The per-layer model description (runtime/model/layer_spec.h) as config.json spells it, checked against what
// transformers 5.17 builds from the same keys (the rules are quoted from its modeling files: Qwen2Attention's
// layer_types, MistralModel's sliding mask on every layer, Qwen2Moe/Qwen3MoeDecoderLayer's mlp_only_layers and
// decoder_sparse_step), plus the config-key audit: every fixture config carries only keys the family reads or keys
// that never change the math, and math keys the engine does not implement are load errors naming them.
#include "runtime/model/config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "runtime/gpu/gpu_layers.h"
#include "runtime/model/config_keys.h"
#include "runtime/model/safetensors.h"

using namespace tierlm::model;

namespace {

// A 4-layer dense config of `family`, left open for more keys (close it with with()).
std::string base(const std::string& family) {
  return R"({"model_type": ")" + family + R"(", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5)";
}
const std::string kQwen2 = base("qwen2");

std::string with(const std::string& base, const std::string& extra) { return base + ", " + extra + "}"; }

std::string error_of(const std::string& json) {
  try {
    parse_config(json, "x/config.json");
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

std::vector<int64_t> windows(const ModelConfig& c) {
  std::vector<int64_t> w;
  for (int64_t i = 0; i < c.num_layers; ++i) w.push_back(c.layer(i).window);
  return w;
}

std::vector<int64_t> expert_layers(const ModelConfig& c) {
  std::vector<int64_t> e;
  for (int64_t i = 0; i < c.num_layers; ++i) e.push_back(c.layer(i).expert_layer);
  return e;
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(LayerSpec, Qwen2LayerTypesAndLegacyMaxWindowLayers) {
  // layer_types decides (what Qwen2Attention reads); sliding_window gives the window.
  auto c = parse_config(with(kQwen2, R"("sliding_window": 8, "use_sliding_window": true, "max_window_layers": 3,
      "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"])"), "c");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 8, 0, 8}));
  EXPECT_EQ(c.layer(1).mixer, Mixer::sliding_attention);
  EXPECT_EQ(c.layer(0).mixer, Mixer::attention);
  EXPECT_TRUE(c.any_windowed());
  // Without layer_types (configs older than transformers 5): layers >= max_window_layers, when use_sliding_window.
  c = parse_config(with(kQwen2, R"("sliding_window": 8, "use_sliding_window": true, "max_window_layers": 3)"), "c");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 0, 0, 8}));
  // Qwen2.5's published configs: a sliding_window value with use_sliding_window false is not used.
  c = parse_config(with(kQwen2, R"("sliding_window": 131072, "use_sliding_window": false, "max_window_layers": 2)"),
                   "c");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_FALSE(c.any_windowed());
  EXPECT_NE(error_of(with(kQwen2, R"("sliding_window": 8, "layer_types": ["full_attention", "linear_attention",
      "full_attention", "full_attention"])")).find("'layer_types' entry 1 ('linear_attention') is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(with(kQwen2, R"("layer_types": ["full_attention"])")).find("one type per layer"),
            std::string::npos);
  EXPECT_NE(error_of(with(kQwen2, R"("sliding_window": null, "layer_types": ["full_attention", "sliding_attention",
      "full_attention", "full_attention"])")).find("'sliding_window' must be positive"), std::string::npos);
}

TEST(LayerSpec, MistralWindowsEveryLayerAndTheStateSpecIsBounded) {
  const std::string mistral = base("mistral");
  auto c = parse_config(with(mistral, R"("sliding_window": 4096)"), "c");
  EXPECT_EQ(windows(c), (std::vector<int64_t>{4096, 4096, 4096, 4096}));
  EXPECT_FALSE(parse_config(with(mistral, R"("sliding_window": null)"), "c").any_windowed());
  EXPECT_NE(error_of(with(mistral, R"("sliding_window": 0)")).find("'sliding_window' must be positive or null"),
            std::string::npos);
  // The state: a ring of ceil((window - 1 + chunk) / 32) + 1 pages, whatever the context beyond it.
  const tierlm::kv::StateSpec s = c.state_spec(0);
  const auto layout = tierlm::kv::layout_for(tierlm::kv::Codec::f32, int(c.head_dim));
  EXPECT_EQ(s.pages(32768, 512), (4096 - 1 + 512 + 31) / 32 + 1);
  EXPECT_EQ(s.pages(131072, 512), s.pages(32768, 512));
  EXPECT_EQ(s.pages(100, 512), 4);  // a short context holds only its own pages
  EXPECT_EQ(s.bytes_per_token(layout), 0.0);
  EXPECT_EQ(s.fixed_bytes(layout, 512), s.bytes(layout, 32768, 512));
  const tierlm::kv::StateSpec full{c.num_kv_heads, c.head_dim, 0};
  EXPECT_EQ(full.pages(32768, 512), 1024);
  EXPECT_EQ(full.bytes_per_token(layout), double(full.page_bytes(layout)) / 32);
}

TEST(LayerSpec, WindowsOnFamiliesWithoutAFixtureAreRefusedByName) {
  const std::string qwen3 = base("qwen3");
  const std::string e = error_of(with(qwen3, R"("sliding_window": 8, "use_sliding_window": true,
      "max_window_layers": 1)"));
  EXPECT_NE(e.find("'sliding_window'"), std::string::npos) << e;
  EXPECT_NE(e.find("not supported yet"), std::string::npos) << e;
  // llama does not read sliding_window at all (transformers' LlamaAttention ignores it), so it changes nothing.
  const std::string llama = base("llama");
  EXPECT_FALSE(parse_config(with(llama, R"("sliding_window": 8)"), "c").any_windowed());
}

TEST(LayerSpec, SparseStepAndMlpOnlyLayersFollowTransformers) {
  const std::string moe = R"({"model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32)";
  // (i + 1) % step == 0 and i not in mlp_only_layers: layers 1, 5 sparse (3 listed dense).
  auto c = parse_config(with(moe, R"("decoder_sparse_step": 2, "mlp_only_layers": [3])"), "c");
  EXPECT_EQ(expert_layers(c), (std::vector<int64_t>{-1, 0, -1, -1, -1, 1}));
  EXPECT_EQ(c.sparse_layers(), 2);
  EXPECT_EQ(c.layer(0).mlp, Mlp::dense);
  EXPECT_EQ(c.layer(5).mlp, Mlp::moe);
  c = parse_config(with(moe, R"("decoder_sparse_step": 1, "mlp_only_layers": [0, 2])"), "c");
  EXPECT_EQ(expert_layers(c), (std::vector<int64_t>{-1, 0, -1, 1, 2, 3}));
  c = parse_config(moe + "}", "c");
  EXPECT_EQ(c.sparse_layers(), 6);
  EXPECT_NE(error_of(with(moe, R"("mlp_only_layers": [6])")).find("'mlp_only_layers' layer 6 is outside"),
            std::string::npos);
  EXPECT_NE(error_of(with(moe, R"("decoder_sparse_step": 0)")).find("'decoder_sparse_step' must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of(with(moe, R"("mlp_only_layers": [0, 1, 2, 3, 4, 5])")).find("no sparse layer"),
            std::string::npos);
  // Dense layers need intermediate_size.
  const std::string no_dense_width = R"({"model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32)";
  EXPECT_NE(error_of(with(no_dense_width, R"("mlp_only_layers": [0])")).find("'intermediate_size'"),
            std::string::npos);
  // mixtral has no such keys: every layer is sparse.
  EXPECT_EQ(parse_config(read(std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/mixtral/config.json"),
                         "c").sparse_layers(), 2);
}

TEST(LayerSpec, BiasesFromAttentionBiasAndMlpBias) {
  const std::string llama = base("llama");
  auto c = parse_config(with(llama, R"("attention_bias": true, "mlp_bias": true)"), "c");
  EXPECT_TRUE(c.arch.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.mlp_bias);
  c = parse_config(with(kQwen2, R"("attention_bias": true, "mlp_bias": true)"), "c");  // qwen2 reads neither
  EXPECT_TRUE(c.arch.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
}

TEST(ConfigKeys, ListsPerFamilyTheKeysRead) {
  for (const std::string& family : supported_architectures()) {
    const auto keys = config_keys_read(*find_architecture(family));
    std::printf("%-10s %s\n", family.c_str(), fmt::format("{}", fmt::join(keys, " ")).c_str());
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
    for (const char* common : {"hidden_size", "num_hidden_layers", "rope_parameters", "head_dim"})
      EXPECT_TRUE(std::binary_search(keys.begin(), keys.end(), common)) << family << " " << common;
  }
  auto has = [](const std::string& family, const std::string& key) {
    const auto keys = config_keys_read(*find_architecture(family));
    return std::binary_search(keys.begin(), keys.end(), key);
  };
  EXPECT_TRUE(has("mistral", "sliding_window"));
  EXPECT_TRUE(has("qwen2", "max_window_layers"));
  EXPECT_TRUE(has("llama", "mlp_bias"));
  EXPECT_FALSE(has("llama", "sliding_window"));
  EXPECT_TRUE(has("qwen2_moe", "mlp_only_layers"));
  EXPECT_FALSE(has("mixtral", "mlp_only_layers"));
}

// Every fixture made by transformers carries only keys its family reads or bookkeeping keys; a math key nobody reads
// (a new transformers option, a family's new field) fails here instead of being ignored.
TEST(ConfigKeys, FixtureConfigsCarryNoUnreadKey) {
  int checked = 0;
  std::vector<std::filesystem::directory_entry> dirs;
  for (const char* root : {"tests/fixtures/models", "profiles/models"})
    for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(TIERLM_SOURCE_DIR) / root))
      dirs.push_back(entry);
  for (const auto& entry : dirs) {
    const auto path = entry.path() / "config.json";
    if (!std::filesystem::exists(path)) continue;
    const auto json = boost::json::parse(read(path)).as_object();
    const std::string family(json.at("model_type").as_string());
    const ArchitectureSpec* arch = find_architecture(family);
    if (!arch) {
      // Fixtures made ahead of their engine (issue 16): refused at load, by family name, until the table has them.
      static const std::set<std::string> not_yet = {};
      EXPECT_TRUE(not_yet.count(family)) << path << ": family '" << family << "' is neither supported nor pending";
      try {
        load_config(entry.path());
        ADD_FAILURE() << path << " loaded although its family is not in the table";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find(family), std::string::npos) << e.what();
      }
      continue;
    }
    const auto unread = unread_config_keys(json, *arch);
    EXPECT_TRUE(unread.empty()) << path << ": " << fmt::format("{}", fmt::join(unread, ", "));
    EXPECT_NO_THROW(load_config(entry.path())) << path;
    ++checked;
  }
  EXPECT_GE(checked, 21);  // 20 transformers fixtures (windows, biases, interleaving, DeepSeek) + the default model
  // The audit itself: an unknown key is reported, a bookkeeping one is not.
  auto c = boost::json::parse(with(kQwen2, R"("my_new_scale": 2.0, "use_cache": true)")).as_object();
  EXPECT_EQ(unread_config_keys(c, *find_architecture("qwen2")), (std::vector<std::string>{"my_new_scale"}));
}

TEST(ConfigKeys, UnimplementedMathKeysAreLoadErrorsNamingThem) {
  for (const char* extra : {R"("final_logit_softcapping": 30.0)", R"("attn_logit_softcapping": 50)",
                            R"("partial_rotary_factor": 0.5)", R"("first_k_dense_replace": 3)",
                            R"("quantization_config": {"quant_method": "fp8"})"}) {
    const std::string e = error_of(with(kQwen2, extra));
    const std::string key = std::string(extra).substr(1, std::string(extra).find('"', 1) - 1);
    EXPECT_NE(e.find("'" + key + "'"), std::string::npos) << extra << " -> " << e;
    EXPECT_NE(e.find("x/config.json"), std::string::npos) << e;
  }
  // Neutral values change nothing and load.
  for (const char* extra : {R"("final_logit_softcapping": null)", R"("partial_rotary_factor": 1.0)",
                            R"("first_k_dense_replace": 0)"})
    EXPECT_EQ(error_of(with(kQwen2, extra)), "") << extra;
  // olmoe reads clip_qkv in transformers; tierlm does not implement it.
  const std::string olmoe = read(std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/olmoe/config.json");
  EXPECT_NE(error_of(olmoe.substr(0, olmoe.rfind('}')) + R"(, "clip_qkv": 8.0})").find("'clip_qkv'"),
            std::string::npos);
}

TEST(LayerSpec, GpuBackendRefusesWhatItDoesNotRunByName) {
  // Sliding windows, attention / MLP biases, dense layers among sparse ones and gpt-oss's block run on the GPU
  // (tests/runtime/gpu/gpu_reference_test.cpp holds them to the transformers fixtures); what still does not is
  // refused by name (qwen35_config_test, gemma4_config_test, deepseek_forward_test).
  const std::string mistral = base("mistral");
  auto windowed = parse_config(with(mistral, R"("sliding_window": 8)"), "c");
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(windowed, 2));
  const std::string llama = base("llama");
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(
      parse_config(with(llama, R"("mlp_bias": true, "attention_bias": true)"), "c"), 1));
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(parse_config(with(kQwen2, R"("use_cache": true)"), "c"), 4));
  const std::string moe = R"({"model_type": "qwen2_moe", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 2})";
  EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(parse_config(moe, "c"), 4));
  for (const char* name : {"gpt_oss", "gpt_oss-mxfp4"}) {
    const auto c = load_config(std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / name);
    EXPECT_NO_THROW(tierlm::gpu::GpuLayers::check_supported(c, c.num_layers)) << name;
  }
}
