// The expert tier's counters (hits, misses, bytes, prefetches, conversion time) reach /health and /metrics: an MoE fixture model served by the scheduler, with
// ExpertTierCounters refreshed on the engine thread (SchedulerOptions::after_step) and read by Telemetry.
#include "server/expert_tier_counters.h"

#include <gtest/gtest.h>

#include <future>
#include <string>
#include <utility>
#include <optional>
#include <stdexcept>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/engine/scheduler.h"
#include "runtime/model/model.h"
#include "server/telemetry.h"

namespace tierlm::server {
namespace {

struct Done : engine::SequenceObserver {
  std::promise<engine::SequenceResult> result;
  bool on_token(const engine::TokenOutput&) override { return true; }
  void on_finish(const engine::SequenceResult& r) override { result.set_value(r); }
};

// The qwen3_moe fixture served by a scheduler whose engine thread refreshes ExpertTierCounters after every step.
struct ServedFixture {
  tiering::Ledger ledger;
  std::optional<model::ModelWeights> weights;
  std::shared_ptr<ExpertTierCounters> counters;
  std::optional<engine::Scheduler> scheduler;
  std::optional<Telemetry> telemetry;
  ServedFixture(int64_t slots, int64_t prefetch_limit, int64_t max_batch) {
    model::LoadOptions load;
    load.ledger = &ledger;
    load.experts.cache.slots = slots;
    load.experts.cache.prefetch_limit = prefetch_limit;
    weights.emplace(model::load_model(std::string(TIERLM_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe", load));
    if (!weights->experts) throw std::logic_error("the qwen3_moe fixture loaded without an expert tier");
    counters = std::make_shared<ExpertTierCounters>(weights->experts);
    engine::SchedulerOptions o;
    o.context = 64;
    o.max_batch = max_batch;
    o.threads = 1;
    o.pin_threads = false;
    o.after_step = [c = counters] { c->refresh(); };
    scheduler.emplace(*weights, ledger, o);
    telemetry.emplace(ServerInfo{}, ledger, *scheduler);
    telemetry->set_tiering(counters);
  }
};

TEST(ExpertTierCounters, MoeTierCountersReachHealthAndMetrics) {
  ServedFixture served(/*slots=*/2, /*prefetch_limit=*/0, /*max_batch=*/2);  // 2 slots: some uses must read from disk
  auto& counters = served.counters;
  auto& scheduler = *served.scheduler;
  auto& telemetry = *served.telemetry;

  auto before = telemetry.health();
  EXPECT_TRUE(before.at("tiering").at("available").as_bool());
  EXPECT_GT(before.at("memory").at("tiers").at("disk").to_number<double>(), 0.0);  // the experts' bytes on disk

  engine::SequenceParams p;
  p.prompt = {1, 5, 9, 13, 17, 21, 25, 29};
  p.max_tokens = 8;
  auto done = std::make_shared<Done>();
  auto f = done->result.get_future();
  scheduler.submit(p, done);
  EXPECT_EQ(f.get().finish_reason, "length");
  // The copy is made on the engine thread right after the step that finished the sequence.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counters->counters().cache_misses == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t = counters->counters();
  EXPECT_GT(t.cache_hits + t.cache_misses, 0u);
  EXPECT_GT(t.cache_misses, 0u);
  EXPECT_GT(t.disk_bytes_read, 0u);
  auto h = telemetry.health();
  EXPECT_EQ(h.at("tiering").at("disk_bytes_read").to_number<double>(), double(t.disk_bytes_read));
  EXPECT_NEAR(h.at("tiering").at("cache_hit_rate").as_double(), t.hit_rate(), 1e-12);
  const std::string metrics = telemetry.metrics();
  EXPECT_NE(metrics.find("tierlm_tiering_available 1"), std::string::npos);
  EXPECT_NE(metrics.find("tierlm_disk_read_bytes_total " + fmt::format("{}", double(t.disk_bytes_read))),
            std::string::npos);
  EXPECT_NE(metrics.find("tierlm_memory_tier_bytes{tier=\"disk\"}"), std::string::npos);
  // Every miss's read was converted into the slot format (the fixture's bf16 experts) once, on the engine thread,
  // and /health and /metrics say how long that took beside the read stall.
  EXPECT_EQ(t.conversions, t.cache_misses);
  EXPECT_GT(t.conversion_seconds, 0.0);
  EXPECT_EQ(h.at("tiering").at("conversions").to_number<double>(), double(t.conversions));
  EXPECT_EQ(h.at("tiering").at("conversion_seconds").as_double(), t.conversion_seconds);
  EXPECT_NE(metrics.find("tierlm_expert_conversion_seconds_total " + fmt::format("{}", t.conversion_seconds)),
            std::string::npos);
  // The forward thread's share of the conversions, and expert read errors (none here), as the tier counted them.
  const tiering::ExpertTierTelemetry direct = served.weights->experts->telemetry();
  EXPECT_EQ(t.inline_conversions, direct.inline_conversions);
  EXPECT_EQ(t.inline_conversion_seconds, direct.inline_conversion_seconds);
  EXPECT_EQ(t.conversion_wait_seconds, direct.conversion_wait_seconds);
  EXPECT_LE(t.inline_conversions, t.conversions);
  EXPECT_EQ(h.at("tiering").at("inline_conversions").to_number<double>(), double(direct.inline_conversions));
  EXPECT_EQ(h.at("tiering").at("inline_conversion_seconds").as_double(), direct.inline_conversion_seconds);
  EXPECT_EQ(h.at("tiering").at("conversion_wait_seconds").as_double(), direct.conversion_wait_seconds);
  EXPECT_EQ(h.at("tiering").at("expert_read_errors").to_number<double>(), 0.0);
  // The forward thread's time in the MoE blocks, and of it the experts' compute: both counted, the part within the
  // whole, and published as the tier counted them.
  EXPECT_GT(direct.expert_compute_seconds, 0.0);
  EXPECT_GT(direct.moe_seconds, direct.expert_compute_seconds);
  EXPECT_EQ(h.at("tiering").at("moe_seconds").as_double(), direct.moe_seconds);
  EXPECT_EQ(h.at("tiering").at("expert_compute_seconds").as_double(), direct.expert_compute_seconds);
  for (const auto& [name, value] :
       {std::pair<std::string, double>{"tierlm_expert_inline_conversions_total", double(direct.inline_conversions)},
        {"tierlm_expert_inline_conversion_seconds_total", direct.inline_conversion_seconds},
        {"tierlm_expert_conversion_wait_seconds_total", direct.conversion_wait_seconds},
        {"tierlm_moe_seconds_total", direct.moe_seconds},
        {"tierlm_expert_compute_seconds_total", direct.expert_compute_seconds},
        {"tierlm_expert_read_errors_total", 0.0}})
    EXPECT_NE(metrics.find(fmt::format("{} {}", name, value)), std::string::npos) << name;
  TelemetryCursor cursor;
  auto snap = telemetry.snapshot(cursor);
  EXPECT_TRUE(snap.at("tiering_available").as_bool());
  EXPECT_GT(snap.at("tiers").at("disk").to_number<double>(), 0.0);
}

// The lookahead prefetch's counters (bench/realscale.sh reads its precision and recall from /health).
TEST(ExpertTierCounters, PrefetchCountersReachHealth) {
  // 6 slots: room beside one layer's pinned top-k for the next layer's predicted experts.
  ServedFixture served(/*slots=*/6, /*prefetch_limit=*/8, /*max_batch=*/1);
  auto& counters = served.counters;
  auto& scheduler = *served.scheduler;
  auto& telemetry = *served.telemetry;
  engine::SequenceParams p;
  p.prompt = {1, 5, 9};
  p.max_tokens = 12;  // decode steps are single rows: the lookahead runs on them
  auto done = std::make_shared<Done>();
  auto f = done->result.get_future();
  scheduler.submit(p, done);
  EXPECT_EQ(f.get().finish_reason, "length");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counters->counters().prefetches == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const tiering::ExpertTierTelemetry direct = served.weights->experts->telemetry();
  const auto t = counters->counters();
  EXPECT_GT(t.prefetches, 0u);
  EXPECT_EQ(t.prefetches, direct.prefetches);
  EXPECT_EQ(t.prefetch_hits, direct.prefetch_hits);
  EXPECT_EQ(t.prefetch_wasted, direct.prefetch_wasted);
  EXPECT_LE(t.prefetch_hits + t.prefetch_wasted, t.prefetches);
  auto h = telemetry.health();
  EXPECT_EQ(h.at("tiering").at("prefetches").to_number<double>(), double(t.prefetches));
  EXPECT_EQ(h.at("tiering").at("prefetch_hits").to_number<double>(), double(t.prefetch_hits));
  EXPECT_EQ(h.at("tiering").at("prefetch_wasted").to_number<double>(), double(t.prefetch_wasted));
  // The prefetch gate's view: guesses left unread and the guesses' precision, as the tier counted them.
  EXPECT_EQ(t.prefetch_skipped, direct.prefetch_skipped);
  EXPECT_EQ(h.at("tiering").at("prefetch_skipped").to_number<double>(), double(t.prefetch_skipped));
  EXPECT_EQ(h.at("tiering").at("prefetch_precision").to_number<double>(), direct.prefetch_precision);
  EXPECT_GE(t.prefetch_precision, 0.0);
  EXPECT_LE(t.prefetch_precision, 1.0);
}

}  // namespace
}  // namespace tierlm::server
