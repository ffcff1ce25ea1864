#include "runtime/model/config.h"

#include <fstream>

#include <gtest/gtest.h>

#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"

using namespace tierlm::model;

namespace {

const char* kLlama = R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}, "rope_theta": 500000.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128009], "tie_word_embeddings": true})";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

void expect_error(const std::string& json, const std::string& needle) {
  try {
    parse_config(json, "x/config.json");
    ADD_FAILURE() << "no error for " << needle;
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x/config.json"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Config, ParsesLegacyRopeScalingAndEosList) {
  ModelConfig c = parse_config(kLlama, "config.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128009}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.arch.qkv_bias);
}

TEST(Config, ArchitectureTableDrivesTheBlock) {
  auto qwen2 = parse_config(replace(kLlama, "\"llama\"", "\"qwen2\""), "c");
  EXPECT_TRUE(qwen2.arch.qkv_bias);
  auto qwen3 = parse_config(replace(kLlama, "\"llama\"", "\"qwen3\""), "c");
  EXPECT_TRUE(qwen3.arch.qk_norm);
  auto biased = parse_config(replace(kLlama, "\"rms_norm_eps\"", "\"attention_bias\": true, \"rms_norm_eps\""), "c");
  EXPECT_TRUE(biased.arch.qkv_bias);
}

TEST(Config, ClearErrorsNamingFileAndField) {
  expect_error("{", "not valid JSON");
  expect_error("[]", "expected a JSON object");
  expect_error(replace(kLlama, "\"llama\"", "\"gpt_bigcode\""), "'gpt_bigcode' is not a supported architecture");
  expect_error(replace(kLlama, "\"vocab_size\": 256,", ""), "'vocab_size' is missing");
  expect_error(replace(kLlama, "\"hidden_size\": 64", "\"hidden_size\": \"64\""), "'hidden_size' must be an integer");
  expect_error(replace(kLlama, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"), "must divide");
  expect_error(replace(kLlama, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": -1"), "invalid value");
  expect_error(replace(kLlama, "\"llama3\"", "\"yarn\""), "'yarn' is not supported");
  expect_error(replace(kLlama, "\"rms_norm_eps\"", "\"hidden_act\": \"gelu\", \"rms_norm_eps\""), "'gelu'");
  expect_error(replace(kLlama, "\"rms_norm_eps\"", "\"quantization\": {\"group_size\": 64, \"bits\": 3}, \"rms_norm_eps\""),
               "bits");
}

TEST(Config, MissingFolderAndMismatchedTensorsAreClearErrors) {
  EXPECT_THROW(load_config("/nonexistent/model"), ModelError);
  // A config whose shapes disagree with the weights: the error names the tensor and both shapes.
  auto dir = std::filesystem::temp_directory_path() / ("tierlm_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto src = std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models/llama3";
  std::filesystem::copy_file(src / "model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(src / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir / "config.json") << replace(text, "\"intermediate_size\": 128", "\"intermediate_size\": 96");
  try {
    load_model(dir);
    ADD_FAILURE() << "mismatch not detected";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("gate_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected [96, 64]"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Found by the config_json fuzz harness: an integer field holding a double beyond int64 (7.8e47) was converted
// with undefined behaviour; it must be the field's ordinary error. Token ids must fit an int32.
TEST(Config, IntegersOutsideTheirRangeAreFieldErrors) {
  expect_error(replace(kLlama, "\"hidden_size\": 64", "\"hidden_size\": 777777777777777777777777777777777777777777777764"),
               "hidden_size");
  expect_error(replace(kLlama, "\"hidden_size\": 64", "\"hidden_size\": -1e300"), "hidden_size");
  expect_error(replace(kLlama, "\"hidden_size\": 64", "\"hidden_size\": 1e999"), "hidden_size");
  EXPECT_EQ(parse_config(replace(kLlama, "\"hidden_size\": 64", "\"hidden_size\": 64.0"), "c").hidden_size, 64);
  expect_error(replace(kLlama, "\"bos_token_id\": 128000", "\"bos_token_id\": 4294967296"), "bos_token_id");
  expect_error(replace(kLlama, "[128001, 128009]", "[128001, -5]"), "eos_token_id");
}
