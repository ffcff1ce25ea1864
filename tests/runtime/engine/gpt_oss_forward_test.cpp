// gpt-oss through the one forward pass, against transformers 5.17 (tools/make_fixtures.py made the fixture on the
// device): tests/fixtures/models/gpt_oss has 4 layers alternating sliding (window 8 < the 24-token prompt) and full
// attention, attention sinks, YaRN rope (factor 32, truncate false), q/k/v/o biases, 8 experts top-2 with biases
// behind a router with a bias, the clamped SwiGLU over interleaved gate/up columns. Logits at every prompt position
// and each greedy step within 1e-3 relative, 32 greedy tokens exact; chunked prefill (1, 5, 24) equal to the whole
// prompt; a batch equal to each sequence alone; and checks that the fixture discriminates (sinks, YaRN's attention
// factor and the router bias each matter).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "tests/runtime/engine/fixture_checks.h"

#include "calibrate/model_profile.h"
#include "runtime/model/model.h"
#include "runtime/model/moe_model.h"
#include "tiering/expert_tier.h"

using namespace tierlm;

namespace {

using tierlm::fixtures::fixture;
using tierlm::fixtures::last_logits_error;
const auto load = tierlm::fixtures::load_fixture;

TEST(GptOssForward, ConfigReadsTheBlock) {
  const model::ModelConfig c = model::load_config(fixture("gpt_oss"));
  EXPECT_TRUE(c.arch.gpt_oss);
  EXPECT_TRUE(c.arch.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_FALSE(c.rope.truncate);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.1 * std::log(32.0) + 1.0);
  EXPECT_EQ(c.layer(0).mixer, model::Mixer::sliding_attention);
  EXPECT_EQ(c.layer(0).window, 8);
  EXPECT_EQ(c.layer(1).mixer, model::Mixer::attention);
  EXPECT_EQ(c.layer(1).mlp, model::Mlp::moe);
  EXPECT_EQ(c.sparse_layers(), 4);
  // Without layer_types, GptOssConfig alternates sliding (even layers) and full attention.
  std::ifstream in(fixture("gpt_oss") / "config.json");
  boost::json::object o = boost::json::parse(std::string(std::istreambuf_iterator<char>(in), {})).as_object();
  o.erase("layer_types");
  const model::ModelConfig d = model::parse_config(boost::json::serialize(o), "config.json");
  for (int64_t i = 0; i < d.num_layers; ++i) EXPECT_EQ(d.layer(i), c.layer(i)) << i;
  // A clamp other than GptOssExperts' 7.0 is refused.
  o["swiglu_limit"] = 5.0;
  EXPECT_THROW(model::parse_config(boost::json::serialize(o), "config.json"), model::ModelError);
}

TEST(GptOssForward, LogitsAndGreedyTokens) {
  tiering::Ledger ledger;
  tierlm::fixtures::expect_logits_and_greedy(load("gpt_oss", ledger), "gpt_oss", ledger);
}

TEST(GptOssForward, ChunkedPrefillEqualsWholePrefill) {
  tiering::Ledger ledger;
  tierlm::fixtures::expect_chunked_prefill_equals_whole(load("gpt_oss", ledger), "gpt_oss", ledger);
}

TEST(GptOssForward, BatchOfSequencesEqualsEachAlone) {
  tiering::Ledger ledger;
  tierlm::fixtures::expect_batch_equals_alone(load("gpt_oss", ledger), "gpt_oss", ledger);
}

// Without the sinks, without YaRN's attention factor, or without the router bias the logits leave the 1e-3 bound.
TEST(GptOssForward, SinksYarnAndRouterBiasMatter) {
  tiering::Ledger ledger;
  {
    model::ModelWeights w = load("gpt_oss", ledger);
    ASSERT_LT(last_logits_error(w, "gpt_oss", ledger), 1e-3);
    for (auto& l : w.layers) l.sinks.clear();
    EXPECT_GT(last_logits_error(w, "gpt_oss", ledger), 1e-2);
  }
  {
    model::ModelWeights w = load("gpt_oss", ledger);
    w.config.rope.attention_factor = 1.0;
    EXPECT_GT(last_logits_error(w, "gpt_oss", ledger), 1e-2);
  }
  {
    model::ModelWeights w = load("gpt_oss", ledger);
    for (auto& l : w.layers) l.router_bias.clear();
    EXPECT_GT(last_logits_error(w, "gpt_oss", ledger), 1e-3);
  }
}

// gpt_oss-mxfp4 (OpenAI's checkpoint layout: *_blocks / *_scales, quantization_config mxfp4), against transformers'
// own dequantized math: the experts stay MXFP4 in the tier (blocks + scales as stored, 4.25 bits per weight, plus
// the f32 output biases), and the logits match.
TEST(GptOssMxfp4, ExpertsStayPackedAndLogitsMatch) {
  tiering::Ledger ledger;
  model::ModelWeights w = load("gpt_oss-mxfp4", ledger);
  ASSERT_TRUE(w.config.mxfp4_experts);
  const tiering::ExpertLayout& layout = w.experts->store().layout();
  EXPECT_EQ(layout.format, kernels::WeightFormat::mxfp4);
  EXPECT_EQ(w.experts->store().encoding(), tiering::ExpertEncoding::mxfp4);
  const uint64_t H = uint64_t(w.config.hidden_size), I = uint64_t(w.config.moe_intermediate_size);
  const uint64_t weights = 3 * H * I;  // gate_up (2I x H) and down (H x I)
  EXPECT_EQ(layout.payload_bytes(), weights / 2 + weights / 32 + (2 * I + H) * 4);
  // What the tier reads from the safetensors per expert: the stored blocks, scales and biases (aligned), no more.
  EXPECT_EQ(w.experts->store().extents(0, 0)[0].length, 2 * I * H / 2);
  EXPECT_EQ(w.experts->store().extents(0, 0)[1].length, 2 * I * H / 32);
  // The planner's profile from config.json alone agrees with the tier's layout.
  const calibrate::ModelProfile p =
      calibrate::model_profile_from_config(w.config, kernels::WeightFormat::bf16, kernels::WeightFormat::mxfp4);
  EXPECT_EQ(p.expert_payload_bytes, layout.payload_bytes());
  EXPECT_EQ(p.expert_bytes, layout.bytes);
  tierlm::fixtures::expect_logits_and_greedy(w, "gpt_oss-mxfp4", ledger);
}

TEST(GptOssMxfp4, ChunkedPrefillAndBatch) {
  tiering::Ledger ledger;
  const model::ModelWeights w = load("gpt_oss-mxfp4", ledger);
  tierlm::fixtures::expect_chunked_prefill_equals_whole(w, "gpt_oss-mxfp4", ledger);
  tierlm::fixtures::expect_batch_equals_alone(w, "gpt_oss-mxfp4", ledger);
}

// `tierlm pack` keeps MXFP4 experts MXFP4 (with their f32 biases): the packed file holds the stored size, and the
// model runs from it with the same logits.
TEST(GptOssMxfp4, PackKeepsTheStoredSize) {
  const auto dir = std::filesystem::temp_directory_path() / ("gpt_oss_pack_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto packed = model::pack_experts(fixture("gpt_oss-mxfp4"), std::nullopt, dir / "experts.tierlm");
  const model::ModelConfig c = model::load_config(fixture("gpt_oss-mxfp4"));
  const uint64_t H = uint64_t(c.hidden_size), I = uint64_t(c.intermediate_size), weights = 3 * H * I;
  EXPECT_EQ(tiering::read_packed_header(packed.path).layout.format, kernels::WeightFormat::mxfp4);
  EXPECT_EQ(tiering::read_packed_header(packed.path).layout.payload_bytes(), weights * 17 / 32 + (2 * I + H) * 4);
  tiering::Ledger ledger;
  model::LoadOptions o = tierlm::fixtures::fixture_load_options(ledger);
  o.packed_experts = packed.path;
  const model::ModelWeights w = model::load_model(fixture("gpt_oss-mxfp4"), o);
  EXPECT_EQ(w.experts->store().encoding(), tiering::ExpertEncoding::packed);
  EXPECT_LT(last_logits_error(w, "gpt_oss-mxfp4", ledger), 1e-3);
  std::filesystem::remove_all(dir);
}

// The same experts widened into another slot format (an explicit expert format): still the fixture's math in f32.
TEST(GptOssMxfp4, WidenedToF32ExpertsMatchToo) {
  tiering::Ledger ledger;
  model::LoadOptions o = tierlm::fixtures::fixture_load_options(ledger);
  o.expert_format = kernels::WeightFormat::f32;
  const model::ModelWeights w = model::load_model(fixture("gpt_oss-mxfp4"), o);
  EXPECT_EQ(w.experts->store().layout().format, kernels::WeightFormat::f32);
  EXPECT_LT(last_logits_error(w, "gpt_oss-mxfp4", ledger), 1e-3);
}

}  // namespace
