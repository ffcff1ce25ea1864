// Oracle: exact math written here from transformers 5's formulas, independently of runtime/ — _compute_yarn_parameters
// (correction range from beta_fast / beta_slow over original_max_position_embeddings, floor/ceil, linear ramp between
// interpolated and original frequencies, attention factor get_mscale(factor, mscale) / get_mscale(factor,
// mscale_all_dim) on cos and sin) and DeepseekV2Attention / DeepseekV3Attention's softmax scale (qk_head_dim^-0.5
// times get_mscale(factor, mscale_all_dim)^2 when rope scaling is set). End to end, a degenerate YaRN (factor 1) must
// still give the transformers fixtures' logits, and a real one must move them; transformers' own logits for YaRN
// (factor 40) are checked in deepseek_forward_test (fixtures deepseek_v3-yarn, deepseek_v2-yarn).
#include <cmath>
#include <numbers>
#include <random>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"
#include "tests/runtime/model/safetensors_writer.h"

#include "runtime/engine/ops.h"
#include "runtime/model/model.h"

using namespace tierlm;

namespace {

using fixtures::fixture;
using fixtures::read_json;

const std::filesystem::path kConfigs = std::filesystem::path(TIERLM_SOURCE_DIR) / "profiles/fit-configs";

// transformers' get_mscale / DeepSeek's yarn_get_mscale.
double get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// _compute_yarn_parameters' inv_freq in double precision: dim rotary dims, base, factor, original context, betas.
std::vector<double> yarn_inv_freq(int dim, double base, double factor, double original, double beta_fast,
                                  double beta_slow) {
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
  const double high = std::min(std::ceil(correction_dim(beta_slow)), double(dim - 1));
  std::vector<double> inv(size_t(dim / 2));
  for (int j = 0; j < dim / 2; ++j) {
    const double ramp = std::clamp((j - low) / (high == low ? high - low + 0.001 : high - low), 0.0, 1.0);
    const double extrapolation_factor = 1 - ramp;
    const double extrapolation = 1 / std::pow(base, 2.0 * j / dim), interpolation = extrapolation / factor;
    inv[size_t(j)] = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

model::ModelConfig published(const std::string& name) { return model::load_config(kConfigs / name); }

// The published DeepSeek-V3 and V2-Lite configs (rope_scaling type yarn, factor 40, original 4096, betas 32 / 1;
// mscale = mscale_all_dim = 1 for V3, 0.707 for V2-Lite) load; the attention factor on cos/sin is 1 (equal mscales),
// the softmax scale grows by get_mscale(40, mscale_all_dim)^2, and the rope turns the 64 rope dims only.
TEST(DeepseekYarn, PublishedConfigsLoadWithTheirScales) {
  struct Case {
    const char* folder;
    double mscale_all_dim;
  };
  for (const Case& k : {Case{"deepseek-v3", 1.0}, Case{"deepseek-v2-lite", 0.707}}) {
    const model::ModelConfig c = published(k.folder);
    EXPECT_EQ(c.rope.type, "yarn") << k.folder;
    EXPECT_EQ(c.rope.factor, 40.0) << k.folder;
    EXPECT_EQ(c.rope.original_max_position_embeddings, 4096) << k.folder;
    EXPECT_TRUE(c.rope.truncate) << k.folder;
    EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.0) << k.folder;
    const double m = get_mscale(40, k.mscale_all_dim);
    EXPECT_NEAR(c.mla.softmax_scale, m * m / std::sqrt(192.0), 1e-15) << k.folder;
    EXPECT_GT(c.mla.softmax_scale, 1.5 / std::sqrt(192.0)) << k.folder;  // 1.59x (V2-Lite), 1.87x (V3)
    EXPECT_EQ(c.head_dim, 64) << k.folder;
  }
  const model::ModelConfig lite = published("deepseek-v2-lite");
  EXPECT_EQ(lite.num_layers, 27);
  EXPECT_EQ(lite.num_experts, 64);
  EXPECT_EQ(lite.num_experts_per_tok, 6);
  EXPECT_EQ(lite.shared_expert_intermediate_size, 2 * 1408);
  EXPECT_EQ(lite.mla.q_lora_rank, 0);
  EXPECT_EQ(lite.sparse_layers(), 26);
}

// The rope of V2-Lite's shape: inv_freq per pair as _compute_yarn_parameters computes it (float32 in transformers,
// so within float rounding of the double here), and rotation at several positions with an attention factor that
// is not 1 (mscale 1, mscale_all_dim 0.707: get_mscale(40, 1) / get_mscale(40, 0.707) on cos and sin).
TEST(DeepseekYarn, InverseFrequenciesAndRotationFollowTheFormulas) {
  auto config = read_json(kConfigs / "deepseek-v2-lite/config.json").as_object();
  config["rope_scaling"].as_object()["mscale"] = 1.0;
  const model::ModelConfig c = model::parse_config(boost::json::serialize(config), "v2-lite");
  const double attention_factor = get_mscale(40, 1.0) / get_mscale(40, 0.707);
  EXPECT_NEAR(c.rope.attention_factor, attention_factor, 1e-15);
  EXPECT_GT(attention_factor, 1.05);
  const std::vector<double> expected = yarn_inv_freq(64, 10000, 40, 4096, 32, 1);
  const engine::Rope rope(c.rope, c.mla.qk_rope_head_dim);
  ASSERT_EQ(rope.inverse_frequencies().size(), expected.size());
  int interpolated = 0, original = 0;
  for (size_t j = 0; j < expected.size(); ++j) {
    EXPECT_NEAR(rope.inverse_frequencies()[j], expected[j], 2e-6 * expected[j]) << "pair " << j;
    const double plain = 1 / std::pow(10000.0, 2.0 * double(j) / 64);
    interpolated += std::fabs(expected[j] - plain / 40) < 1e-12 * plain;
    original += std::fabs(expected[j] - plain) < 1e-12 * plain;
  }
  // The ramp leaves some pairs at the original frequency, some fully interpolated and some blended.
  EXPECT_GT(interpolated, 0);
  EXPECT_GT(original, 0);
  EXPECT_LT(interpolated + original, int(expected.size()));

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int64_t pos : {0, 1, 7, 50, 300}) {
    std::vector<float> x(64);
    for (float& v : x) v = normal(rng);
    std::vector<float> y = x;
    rope.apply(y.data(), 1, pos);
    for (int j = 0; j < 32; ++j) {
      const double angle = double(pos) * expected[size_t(j)];
      const double cos = std::cos(angle) * attention_factor, sin = std::sin(angle) * attention_factor;
      const double a = x[size_t(j)], b = x[size_t(j + 32)];
      const double tolerance = 1e-5 + 2e-7 * double(pos) * (std::fabs(a) + std::fabs(b));
      EXPECT_NEAR(y[size_t(j)], a * cos - b * sin, tolerance) << "pos " << pos << " pair " << j;
      EXPECT_NEAR(y[size_t(j + 32)], b * cos + a * sin, tolerance) << "pos " << pos << " pair " << j;
    }
  }
}

// What the definitions read and tierlm refuses: without a factor transformers takes max_position_embeddings /
// original_max_position_embeddings (refused by name here); without mscale_all_dim the softmax scale stays
// qk_head_dim^-0.5; attention_factor given overrides the mscale ratio.
TEST(DeepseekYarn, KeysOfTheRopeScaling) {
  auto base = read_json(kConfigs / "deepseek-v3/config.json").as_object();
  base.erase("quantization_config");
  auto with = [&](auto edit) {
    auto o = base;
    edit(o["rope_scaling"].as_object());
    return boost::json::serialize(o);
  };
  try {
    model::parse_config(with([](auto& r) { r.erase("factor"); }), "v3");
    ADD_FAILURE() << "a yarn rope without factor was accepted";
  } catch (const model::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("factor"), std::string::npos) << e.what();
  }
  const model::ModelConfig no_all_dim = model::parse_config(with([](auto& r) { r.erase("mscale_all_dim"); }), "v3");
  EXPECT_DOUBLE_EQ(no_all_dim.mla.softmax_scale, 1 / std::sqrt(192.0));
  EXPECT_NEAR(no_all_dim.rope.attention_factor, get_mscale(40, 1), 1e-15);  // mscale alone: get_mscale(factor)
  const model::ModelConfig given = model::parse_config(with([](auto& r) { r["attention_factor"] = 0.5; }), "v3");
  EXPECT_EQ(given.rope.attention_factor, 0.5);
}

// A fixture folder whose config.json carries `rope_scaling` (the weights, tokenizer and reference linked in).
struct ScaledFixture {
  test::TempDir dir;
  ScaledFixture(const std::string& name, const boost::json::object& rope_scaling) {
    for (auto& entry : std::filesystem::directory_iterator(fixture(name)))
      if (entry.path().filename() != "config.json")
        std::filesystem::create_symlink(entry.path(), dir / entry.path().filename().string());
    auto config = read_json(fixture(name) / "config.json").as_object();
    config.erase("rope_parameters");
    config["rope_theta"] = 10000.0;
    config["rope_scaling"] = rope_scaling;
    std::ofstream(dir / "config.json") << boost::json::serialize(config);
  }
};

fixtures::ReferenceMatch run(const std::filesystem::path& dir, model::ModelConfig& loaded) {
  tiering::Ledger ledger;
  model::LoadOptions options;
  options.ledger = &ledger;
  options.packed_experts = "";
  model::ModelWeights w = model::load_model(dir, options);
  const fixtures::ReferenceMatch m = fixtures::match_reference(w, ledger, dir, 64);
  loaded = w.config;
  return m;
}

// End to end on the transformers fixtures (v2: q_proj, v3: q LoRA, both interleaved rope): YaRN with factor 1 is
// the plain rope (get_mscale(1) = 1, interpolation = extrapolation), so the fixtures' logits hold through the YaRN
// path; with the published factor 40 and mscale_all_dim they move well past the 1e-3 bound.
TEST(DeepseekYarn, FixturesThroughTheYarnPath) {
  for (const char* name : {"deepseek_v2", "deepseek_v3"}) {
    const boost::json::object degenerate = {{"type", "yarn"}, {"factor", 1.0}, {"mscale", 1.0},
                                            {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                                            {"beta_fast", 32}, {"beta_slow", 1}};
    ScaledFixture same(name, degenerate);
    model::ModelConfig seen;
    const fixtures::ReferenceMatch m = run(same.dir.path, seen);
    EXPECT_EQ(seen.rope.type, "yarn");
    EXPECT_LT(m.prompt_error, 1e-3) << name;
    EXPECT_LT(m.step_error, 1e-3) << name;
    EXPECT_EQ(m.greedy_matches, m.greedy_total) << name;

    boost::json::object scaled = degenerate;
    scaled["factor"] = 40.0;
    scaled["mscale"] = 0.707;
    scaled["mscale_all_dim"] = 0.707;
    scaled["original_max_position_embeddings"] = 4;  // a 4-position original context: the prompt runs past it
    ScaledFixture moved(name, scaled);
    const fixtures::ReferenceMatch n = run(moved.dir.path, seen);
    EXPECT_GT(seen.mla.softmax_scale, 1.5 / std::sqrt(double(seen.mla.qk_head_dim())));
    EXPECT_GT(n.prompt_error, 1e-2) << name;
    std::printf("[%s] yarn factor 1: prompt rel err %.2e, step %.2e, greedy %d/%d; factor 40: prompt rel err %.2e\n",
                name, m.prompt_error, m.step_error, m.greedy_matches, m.greedy_total, n.prompt_error);
  }
}

}  // namespace
