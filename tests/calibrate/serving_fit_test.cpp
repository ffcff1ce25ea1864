// fit_serving: a stored plan fitted to the batch, context and budget serve asks for. Oracle: the planner itself and
// the KV arithmetic (kv_cache_bytes): a plan that covers the request stands; one that does not is re-fitted with the
// KV taken from the expert cache; one that cannot fit is refused with a "what fits" that the planner confirms.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <regex>

#include "calibrate/serving_fit.h"
#include "tests/calibrate/planner_profiles.h"

namespace tierlm::calibrate {
namespace {

using test_profiles::device;
using test_profiles::qwen3_moe_30b;

WisdomEntry entry_for(uint64_t budget, int64_t batch, int64_t context) {
  WisdomEntry e;
  e.device = device("laptop-8gb");
  e.model = qwen3_moe_30b();
  PlanRequest r;
  r.budget_bytes = budget;
  r.batch = batch;
  r.context = context;
  e.plan = make_plan(e.device, e.model, r);
  return e;
}

uint64_t expert_memory(const Plan& p) {
  return p.prediction.memory.at("resident_experts") + p.prediction.memory.at("expert_cache");
}

TEST(ServingFit, APlanThatCoversTheRequestStands) {
  const WisdomEntry e = entry_for(6ull << 30, 8, 4096);
  for (const auto& [batch, context] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {8, 4096}, {4, 1024}}) {
    ServingRequest r;
    r.batch = batch;
    r.context = context;
    const ServingFit fit = fit_serving(e, r);
    EXPECT_FALSE(fit.refitted) << batch << " x " << context;
    EXPECT_EQ(fit.plan.cache_slots, e.plan.cache_slots);
    EXPECT_EQ(fit.plan.resident_count(), e.plan.resident_count());
    EXPECT_TRUE(fit.note.empty());
  }
}

TEST(ServingFit, ALargerBatchShrinksTheExpertCacheAndSaysSo) {
  const WisdomEntry e = entry_for(6ull << 30, 8, 4096);
  ServingRequest r;
  r.batch = 16;
  const ServingFit fit = fit_serving(e, r);
  ASSERT_TRUE(fit.refitted);
  EXPECT_EQ(fit.plan.batch, 16);
  EXPECT_EQ(fit.plan.context, 4096);
  EXPECT_EQ(fit.plan.kv_codec, e.plan.kv_codec);  // the plan's codec still fits: only the cache gives way
  EXPECT_EQ(fit.plan.budget_bytes, e.plan.budget_bytes);
  EXPECT_EQ(fit.plan.prediction.memory.at("kv"), kv_cache_bytes(e.model, e.plan.kv_codec, 4096, 16));
  EXPECT_LT(expert_memory(fit.plan), expert_memory(e.plan));
  EXPECT_LE(fit.plan.prediction.total_memory(), fit.plan.budget_bytes);
  EXPECT_EQ(fit.plan.device_fingerprint, e.plan.device_fingerprint);
  EXPECT_EQ(fit.plan.threads, e.plan.threads);
  EXPECT_NE(fit.note.find("--max-batch 16"), std::string::npos) << fit.note;
  EXPECT_NE(fit.note.find("expert cache shrinks"), std::string::npos) << fit.note;
  // A smaller --mem-budget is a re-fit too.
  ServingRequest smaller;
  smaller.budget_bytes = 5ull << 30;
  const ServingFit cut = fit_serving(e, smaller);
  ASSERT_TRUE(cut.refitted);
  EXPECT_LE(cut.plan.prediction.total_memory(), 5ull << 30);
}

// serve's re-fit plans on the router trace the wisdom file keeps, as calibrate did: the resident set ranked on its
// first half, the hit rate replayed on the second, never the ~100% of a replay on the tokens it was chosen on.
// More threads than the plan's: each is a MoE prefill lane of scratch (engine::moe_lane_bytes), so the plan is
// re-fitted with them (the planner's scratch counts them), as a larger batch is; fewer threads stand.
TEST(ServingFit, MoreThreadsThanThePlansAreRefittedWithTheirLanes) {
  const WisdomEntry e = entry_for(6ull << 30, 8, 4096);
  ServingRequest fewer;
  fewer.threads = std::max(1, e.plan.threads - 1);
  EXPECT_FALSE(fit_serving(e, fewer).refitted);
  ServingRequest more;
  more.threads = e.plan.threads + 32;
  const ServingFit fit = fit_serving(e, more);
  ASSERT_TRUE(fit.refitted);
  EXPECT_EQ(fit.plan.threads, more.threads);
  EXPECT_GT(fit.plan.prediction.memory.at("scratch"), e.plan.prediction.memory.at("scratch"));
  EXPECT_NE(fit.note.find("--threads " + std::to_string(more.threads)), std::string::npos) << fit.note;
  uint64_t total = 0;
  for (const auto& [account, bytes] : fit.plan.prediction.memory) total += bytes;
  EXPECT_LE(total, fit.plan.budget_bytes);
}

TEST(ServingFit, ARefitIsJudgedOnTheStoredTracesHeldOutHalf) {
  WisdomEntry e = entry_for(6ull << 30, 1, 4096);
  e.model.moe_layers = 4;
  e.model.expert_frequency.resize(4);
  std::mt19937 rng(5);
  RouterTrace t{4, e.model.experts, e.model.top_k, {}};
  for (int i = 0; i < 16; ++i)
    for (int64_t l = 0; l < 4; ++l) {
      std::vector<int32_t> ids(size_t(e.model.experts));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      t.selections.insert(t.selections.end(), ids.begin(), ids.begin() + e.model.top_k);
    }
  e.model.expert_frequency = frequencies(t);
  e.model.trace_selections = t.selections;
  const ModelProfile back = model_profile_from_json(to_json(e.model));  // kept through the wisdom file
  EXPECT_EQ(back.trace_selections, t.selections);
  PlanRequest r;
  r.budget_bytes = e.model.dense_bytes() + e.model.total_expert_bytes() / 2 + (512ull << 20);
  r.context = 1024;
  r.trace = &t;
  e.plan = make_plan(e.device, e.model, r);
  ServingRequest s;
  s.batch = 2;
  const ServingFit fit = fit_serving(e, s);
  ASSERT_TRUE(fit.refitted);
  PlanRequest q = r;
  q.batch = 2;
  q.threads = e.plan.threads;
  q.gpu_layers = e.plan.gpu_layers;
  q.kv_codec = e.plan.kv_codec;
  EXPECT_DOUBLE_EQ(fit.plan.prediction.expert_hit_rate, make_plan(e.device, e.model, q).prediction.expert_hit_rate);
  EXPECT_LT(fit.plan.prediction.expert_hit_rate, 0.9);  // uniform routing, about half the experts in memory
}

TEST(ServingFit, WhatCannotFitIsRefusedWithWhatFits) {
  const WisdomEntry e = entry_for(6ull << 30, 8, 4096);
  ServingRequest r;
  r.batch = 1024;
  try {
    fit_serving(e, r);
    FAIL() << "expected ServingFitError";
  } catch (const ServingFitError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("--max-batch 1024 --context 4096 does not fit"), std::string::npos) << what;
    EXPECT_NE(what.find("raise --mem-budget"), std::string::npos) << what;
    EXPECT_EQ(what.find("memory budget exceeded"), std::string::npos) << what;
    std::smatch match;
    ASSERT_TRUE(std::regex_search(what, match, std::regex("What fits: --max-batch (\\d+) at --context 4096"))) << what;
    const int64_t fits = std::stoll(match[1]);
    ASSERT_GT(fits, 8);
    ASSERT_LT(fits, 1024);
    // The planner agrees: that batch fits (with some codec), one more does not.
    ServingRequest ok;
    ok.batch = fits;
    EXPECT_NO_THROW(fit_serving(e, ok));
    ServingRequest over;
    over.batch = fits + 1;
    EXPECT_THROW(fit_serving(e, over), ServingFitError);
    ASSERT_TRUE(std::regex_search(what, match, std::regex("--context (\\d+) at --max-batch 1024"))) << what;
    const int64_t context = std::stoll(match[1]);
    ServingRequest long_enough;
    long_enough.batch = 1024;
    long_enough.context = context;
    EXPECT_NO_THROW(fit_serving(e, long_enough));
    long_enough.context = context + 32;
    EXPECT_THROW(fit_serving(e, long_enough), ServingFitError);
  }
}

}  // namespace
}  // namespace tierlm::calibrate
