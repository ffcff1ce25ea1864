// Telemetry (server/telemetry.h) with GPU numbers: a GpuCounters snapshot fed through a GpuCountersProvider must reach
// /health, /metrics and the telemetry stream exactly; without one the GPU metrics are absent and gpu layers read 0.
// No GPU needed: the provider is a fixed snapshot (server/gpu_layers_counters.h fills the real one).
#include "server/telemetry.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include <boost/json.hpp>

#include "runtime/engine/scheduler.h"
#include "runtime/model/model.h"

namespace tierlm::server {
namespace {

struct FixedGpu : GpuCountersProvider {
  GpuCounters snapshot;
  GpuCounters gpu_counters() const override { return snapshot; }
};

struct Served {
  tiering::Ledger ledger;
  model::ModelWeights weights;
  engine::Scheduler scheduler;
  Telemetry telemetry;
  Served() : weights(load()), scheduler(weights, ledger, options()), telemetry(ServerInfo{}, ledger, scheduler) {}
  model::ModelWeights load() {
    model::LoadOptions o;
    o.ledger = &ledger;
    return model::load_model(std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny", o);
  }
  static engine::SchedulerOptions options() {
    engine::SchedulerOptions o;
    o.context = 64;
    o.max_batch = 2;
    o.threads = 1;
    o.pin_threads = false;
    return o;
  }
};

GpuCounters sample_gpu() {
  GpuCounters g;
  g.layers = 4;
  g.model_layers = 6;
  g.output_head = false;
  g.weight_bytes = 123456789;
  g.vram_budget = 80ull << 30;
  g.vram_used = 900000000;
  g.vram_peak = 950000000;
  g.vram_accounts = {{"kv", 200000000, 250000000, 2}, {"weights", 700000000, 700000000, 30}};
  g.expert_resident_hits = 700;
  g.expert_slot_hits = 200;
  g.expert_misses = 100;
  g.expert_bytes_copied = 4096000;
  g.expert_device_routed = 48;
  g.expert_cpu = 37;
  return g;
}

// Every line of the exposition is a HELP, a TYPE or a well-formed sample (the full validator is in
// http_server_test); returns the sample lines.
std::vector<std::string> samples(const std::string& text) {
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$)");
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << line;
    out.push_back(line);
  }
  return out;
}

bool has_line(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

TEST(Telemetry, WithoutGpuLayersTheGpuMetricsAreAbsent) {
  Served s;
  const auto h = s.telemetry.health();
  EXPECT_EQ(h.at("gpu").at("layers").to_number<int64_t>(), 0);
  EXPECT_FALSE(h.at("gpu").as_object().contains("vram"));
  const std::string text = s.telemetry.metrics();
  const auto lines = samples(text);
  EXPECT_TRUE(has_line(lines, "tierlm_gpu_layers 0"));
  for (const char* absent : {"tierlm_gpu_vram", "tierlm_gpu_expert", "tierlm_gpu_weight_bytes"})
    EXPECT_EQ(text.find(absent), std::string::npos) << absent;
  TelemetryCursor cursor;
  const auto snap = s.telemetry.snapshot(cursor);
  EXPECT_EQ(snap.at("gpu_layers").to_number<int64_t>(), 0);
  EXPECT_FALSE(snap.contains("gpu_vram_used_bytes"));
}

TEST(Telemetry, GpuSnapshotReachesHealthMetricsAndStream) {
  Served s;
  auto gpu = std::make_shared<FixedGpu>();
  gpu->snapshot = sample_gpu();
  s.telemetry.set_gpu(gpu);

  const auto h = s.telemetry.health();
  const auto& g = h.at("gpu").as_object();
  EXPECT_EQ(g.at("layers").to_number<int64_t>(), 4);
  EXPECT_EQ(g.at("model_layers").to_number<int64_t>(), 6);
  EXPECT_FALSE(g.at("output_head").as_bool());
  EXPECT_EQ(g.at("weight_bytes").to_number<uint64_t>(), 123456789u);
  const auto& vram = g.at("vram").as_object();
  EXPECT_EQ(vram.at("budget_bytes").to_number<uint64_t>(), 80ull << 30);
  EXPECT_EQ(vram.at("used_bytes").to_number<uint64_t>(), 900000000u);
  EXPECT_EQ(vram.at("peak_bytes").to_number<uint64_t>(), 950000000u);
  EXPECT_EQ(vram.at("accounts").at("kv").at("bytes").to_number<uint64_t>(), 200000000u);
  EXPECT_EQ(vram.at("accounts").at("kv").at("peak_bytes").to_number<uint64_t>(), 250000000u);
  EXPECT_EQ(vram.at("accounts").at("weights").at("allocations").to_number<uint64_t>(), 30u);
  const auto& experts = g.at("experts").as_object();
  EXPECT_EQ(experts.at("resident_hits").to_number<uint64_t>(), 700u);
  EXPECT_EQ(experts.at("slot_hits").to_number<uint64_t>(), 200u);
  EXPECT_EQ(experts.at("misses").to_number<uint64_t>(), 100u);
  EXPECT_EQ(experts.at("bytes_copied").to_number<uint64_t>(), 4096000u);
  EXPECT_EQ(experts.at("device_routed_layer_steps").to_number<uint64_t>(), 48u);
  EXPECT_EQ(experts.at("on_cpu").to_number<uint64_t>(), 37u);
  EXPECT_DOUBLE_EQ(experts.at("hit_rate").as_double(), 0.9);

  const auto lines = samples(s.telemetry.metrics());
  for (const char* line : {"tierlm_gpu_layers 4", "tierlm_gpu_output_head 0", "tierlm_gpu_weight_bytes 123456789",
                           "tierlm_gpu_vram_bytes{account=\"kv\"} 200000000",
                           "tierlm_gpu_vram_bytes{account=\"weights\"} 700000000",
                           "tierlm_gpu_vram_peak_bytes{account=\"kv\"} 250000000",
                           "tierlm_gpu_vram_budget_bytes 85899345920",
                           "tierlm_gpu_expert_hits_total{tier=\"resident\"} 700",
                           "tierlm_gpu_expert_hits_total{tier=\"slot\"} 200", "tierlm_gpu_expert_misses_total 100",
                           "tierlm_gpu_expert_copied_bytes_total 4096000", "tierlm_gpu_moe_device_routed_total 48",
                           "tierlm_gpu_expert_cpu_total 37"})
    EXPECT_TRUE(has_line(lines, line)) << line;

  TelemetryCursor cursor;
  const auto snap = s.telemetry.snapshot(cursor);
  EXPECT_EQ(snap.at("gpu_layers").to_number<int64_t>(), 4);
  EXPECT_EQ(snap.at("gpu_vram_used_bytes").to_number<uint64_t>(), 900000000u);
  EXPECT_DOUBLE_EQ(snap.at("gpu_expert_hit_rate").as_double(), 0.9);
}

TEST(Telemetry, UnlimitedVramBudgetIsNullAndHasNoSample) {
  Served s;
  auto gpu = std::make_shared<FixedGpu>();
  gpu->snapshot = sample_gpu();
  gpu->snapshot.vram_budget = tiering::Ledger::kUnlimited;
  s.telemetry.set_gpu(gpu);
  EXPECT_TRUE(s.telemetry.health().at("gpu").at("vram").at("budget_bytes").is_null());
  const std::string text = s.telemetry.metrics();
  EXPECT_NE(text.find("# TYPE tierlm_gpu_vram_budget_bytes gauge"), std::string::npos);
  EXPECT_EQ(text.find("\ntierlm_gpu_vram_budget_bytes "), std::string::npos);
}

}  // namespace
}  // namespace tierlm::server
