// Oracle: engine::perplexity (itself checked against transformers in tests/runtime/engine/perplexity_test.cpp) on
// the trained code-small fixture: calibrate's KV quality pass records each lossy codec's perplexity increase over the
// exact cache on profiles/text/kv-quality.txt, within its time budget; the wisdom JSON keeps it; MLA models (whose
// latent cache takes no turbo codec) record only what they accept.
#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "calibrate/kv_quality.h"
#include "calibrate/model_profile.h"
#include "runtime/kv/codec.h"
#include "runtime/model/config.h"
#include "runtime/engine/perplexity.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/runtime/engine/reference_fixture.h"

namespace tierlm::calibrate {
namespace {

model::ModelWeights load(const std::filesystem::path& dir, tiering::Ledger& ledger) {
  model::LoadOptions o;
  o.ledger = &ledger;
  return model::load_model(dir, o);
}

TEST(KvQuality, RecordsEachCodecsPerplexityIncreaseOverTheExactCache) {
  const auto dir = fixtures::fixture("code-small");
  tiering::Ledger ledger;
  const model::ModelWeights w = load(dir, ledger);
  ModelProfile p;
  KvQualityOptions o;
  o.threads = 2;
  measure_kv_quality(w, dir, ledger, o, p);
  EXPECT_EQ(p.kv_quality_tokens, 1024);  // the default, within the model's 2,048 positions
  ASSERT_EQ(p.kv_perplexity_increase.size(), 4u);
  EXPECT_LT(std::fabs(p.kv_perplexity_increase.at("f16")), 1e-3);
  EXPECT_LT(std::fabs(p.kv_perplexity_increase.at("q8")), 5e-3);
  // The same numbers engine::perplexity gives on the same tokens.
  std::ifstream in(o.text_path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int32_t> ids = tok::Tokenizer::load(dir).encode(ss.str(), true);
  ids.resize(1024);
  kernels::ThreadPool pool(2);
  const double exact = engine::perplexity(w, pool, ledger, ids, {kv::Codec::f32, {}, {}}, 64).perplexity();
  const double turbo3 = engine::perplexity(w, pool, ledger, ids, {kv::Codec::turbo3, {}, {}}, 64).perplexity();
  EXPECT_NEAR(p.kv_perplexity_increase.at("turbo3"), turbo3 / exact - 1, 1e-9);
  std::printf("code-small, 1,024 tokens: f16 %+.3f%%, q8 %+.3f%%, turbo4 %+.3f%%, turbo3 %+.3f%%\n",
              100 * p.kv_perplexity_increase.at("f16"), 100 * p.kv_perplexity_increase.at("q8"),
              100 * p.kv_perplexity_increase.at("turbo4"), 100 * p.kv_perplexity_increase.at("turbo3"));

  // Through the wisdom JSON and back.
  ModelProfile q = model_profile_from_json(to_json([&] {
    ModelProfile base = model_profile_from_config(w.config, kernels::WeightFormat::bf16, kernels::WeightFormat::bf16);
    base.fingerprint = std::string(1, 'x');  // not = "x": GCC 12 warns falsely (-Wrestrict) on that assignment
    base.kv_perplexity_increase = p.kv_perplexity_increase;
    base.kv_quality_tokens = p.kv_quality_tokens;
    return base;
  }()));
  EXPECT_EQ(q.kv_perplexity_increase, p.kv_perplexity_increase);
  EXPECT_EQ(q.kv_quality_tokens, 1024);
}

TEST(KvQuality, NotMeasuredWhenTheBudgetCannotPayForEnoughTokens) {
  const auto dir = fixtures::fixture("code-small");
  tiering::Ledger ledger;
  const model::ModelWeights w = load(dir, ledger);
  ModelProfile p;
  p.kv_perplexity_increase["turbo3"] = 0.5;  // stale values go
  KvQualityOptions o;
  o.max_seconds = 1e-4;
  measure_kv_quality(w, dir, ledger, o, p);
  EXPECT_TRUE(p.kv_perplexity_increase.empty());
  EXPECT_EQ(p.kv_quality_tokens, 0);
  o.max_seconds = 0;  // skipped outright
  measure_kv_quality(w, dir, ledger, o, p);
  EXPECT_TRUE(p.kv_perplexity_increase.empty());
}

// A figure measured on other numerics of a codec (turbo3 before its keys became 4-bit: +1.45% on code-small, now
// -0.01%) is dropped when the wisdom is read, as if not measured, so the planner does not judge today's codec by it;
// figures of the codec's current revision stay.
TEST(KvQuality, AFigureMeasuredOnAnotherRevisionOfTheCodecIsNotTrusted) {
  ModelProfile base = model_profile_from_config(model::load_config(fixtures::fixture("code-small")),
                                                kernels::WeightFormat::bf16, kernels::WeightFormat::bf16);
  base.fingerprint = std::string(1, 'x');  // not = "x": GCC 12 warns falsely (-Wrestrict) on that assignment
  base.kv_quality_tokens = 1024;
  base.kv_perplexity_increase = {{"f16", 1e-5}, {"turbo3", 0.0145}, {"turbo4", 0.008}};
  boost::json::value v = to_json(base);
  auto& q = v.as_object()["kv_quality"].as_object();
  EXPECT_EQ(q["revisions"].as_object()["turbo3"].as_int64(), kv::codec_revision(kv::Codec::turbo3));
  EXPECT_EQ(model_profile_from_json(v).kv_perplexity_increase, base.kv_perplexity_increase);  // current: kept

  q["revisions"].as_object()["turbo3"] = kv::codec_revision(kv::Codec::turbo3) - 1;
  std::map<std::string, double> without = base.kv_perplexity_increase;
  without.erase("turbo3");
  EXPECT_EQ(model_profile_from_json(v).kv_perplexity_increase, without);
  q.erase("revisions");  // written before codecs had revisions: revision 1 each, so turbo3's figure is stale
  EXPECT_EQ(model_profile_from_json(v).kv_perplexity_increase, without);
}

TEST(KvQuality, MlaModelsRecordOnlyTheCodecsTheirLatentCacheTakes) {
  const auto dir = fixtures::fixture("deepseek_v3");
  tiering::Ledger ledger;
  const model::ModelWeights w = load(dir, ledger);
  ModelProfile p;
  KvQualityOptions o;
  o.max_tokens = 128;
  o.min_tokens = 16;
  measure_kv_quality(w, dir, ledger, o, p);  // no tokenizer: the text's bytes as ids
  EXPECT_EQ(p.kv_perplexity_increase.count("turbo3"), 0u);
  EXPECT_EQ(p.kv_perplexity_increase.count("turbo4"), 0u);
}

}  // namespace
}  // namespace tierlm::calibrate
