// server/telemetry.h — everything the server reports about itself: the JSON of GET /health, the Prometheus text of
// GET /metrics and the per-second snapshots of GET /v1/telemetry. It reads the ledger (memory by account), the
// process (RSS, cgroup limit), the scheduler (KV, queue, tokens) and, through TieringCountersProvider, whatever tier
// counters the engine has (the MoE expert tier plugs in there; until one is attached they read as zeros and
// "available": false says so), and, through GpuCountersProvider, the GPU layers' VRAM and expert counters (absent
// without GPU layers). Owns: HTTP request counters, the latency histogram and the count of refused requests by reason.
// Never: blocks on the engine (scheduler stats are copied under its short lock).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/json/object.hpp>

#include "runtime/engine/scheduler.h"
#include "tiering/ledger.h"

namespace tierlm::server {

// Counters of the storage tiers below RAM (expert cache, disk reads), as a plain snapshot.
struct TieringCounters {
  bool available = false;           // false: no tier is attached; every number below is zero
  std::string source;               // e.g. "expert_tier"
  uint64_t disk_bytes_read = 0;
  uint64_t disk_reads = 0;
  uint64_t cache_hits = 0, cache_misses = 0;
  uint64_t prefetches = 0, prefetch_hits = 0, evictions = 0;
  uint64_t prefetch_wasted = 0;     // prefetched experts evicted before any use
  uint64_t prefetch_skipped = 0;    // guesses not read: at their measured precision reading them did not pay
  double prefetch_precision = 0;    // the guesses' running precision (read or not)
  double read_stall_seconds = 0;
  uint64_t conversions = 0;        // expert reads converted into the slot format (worker or forward thread)
  double conversion_seconds = 0;   // ... and the time that took
  uint64_t inline_conversions = 0;        // ... of them done by the forward thread itself
  double inline_conversion_seconds = 0;   // ... and the time those took
  double conversion_wait_seconds = 0;     // time the forward thread waited for the worker's conversions
  double moe_seconds = 0;                 // the forward thread's time in the streamed MoE blocks
  double expert_compute_seconds = 0;      // ... of it, running the experts
  uint64_t expert_read_errors = 0;  // expert loads that failed (demand: the request failed; prefetch: dropped)
  std::map<std::string, uint64_t> bytes_by_tier;  // bytes held per tier beyond the ledger's RAM, e.g. {"disk": n}
  double hit_rate() const { return cache_hits + cache_misses ? double(cache_hits) / double(cache_hits + cache_misses) : 0; }
};

// Implemented by the engine's tier (an adapter around tiering's own telemetry struct). Called from I/O threads:
// implementations must be thread-safe and cheap.
class TieringCountersProvider {
 public:
  virtual ~TieringCountersProvider() = default;
  virtual TieringCounters counters() const = 0;
};

// The GPU layers (runtime/gpu) as a plain snapshot: what runs there, the VRAM ledger, the VRAM expert tier.
struct GpuCounters {
  int64_t layers = 0;               // layers on the GPU; 0: none, and every field below is empty
  int64_t model_layers = 0;
  bool output_head = false;         // the final norm and output head run there too
  uint64_t weight_bytes = 0;        // device bytes of the uploaded weights
  uint64_t vram_budget = tiering::Ledger::kUnlimited;
  uint64_t vram_used = 0, vram_peak = 0;
  std::vector<tiering::AccountUsage> vram_accounts;  // the VRAM ledger by account (weights, kv, scratch, experts...)
  uint64_t expert_resident_hits = 0;  // expert uses served by the experts resident in VRAM
  uint64_t expert_slot_hits = 0;      // ... by an expert already in a VRAM slot
  uint64_t expert_misses = 0;         // ... that copied the expert from host memory into a slot
  uint64_t expert_bytes_copied = 0;   // host -> VRAM expert bytes
  uint64_t expert_device_routed = 0;  // MoE layer steps routed on the device (decode, all experts resident)
  uint64_t expert_cpu = 0;            // GPU layers' experts run on the CPU (hybrid placement), one per expert a step
  double expert_hit_rate() const {
    const uint64_t hits = expert_resident_hits + expert_slot_hits;
    return hits + expert_misses ? double(hits) / double(hits + expert_misses) : 0;
  }
};

// Implemented by the GPU layers' adapter (server/gpu_layers_counters.h). Called from I/O threads: implementations
// must be thread-safe and cheap, and must not call into the GPU layers (the engine thread owns them).
class GpuCountersProvider {
 public:
  virtual ~GpuCountersProvider() = default;
  virtual GpuCounters gpu_counters() const = 0;
};

struct ServerInfo {
  std::string model_id;
  std::string model_path;
  std::string architecture;
  uint64_t weight_bytes = 0;
  std::string chat_template;        // which renderer is active
  int threads = 0;
};

// Per-connection state of the telemetry stream, to turn totals into rates.
struct TelemetryCursor {
  std::chrono::steady_clock::time_point time{};
  uint64_t generated = 0, prefilled = 0, hits = 0, misses = 0, requests = 0;
};

class Telemetry {
 public:
  Telemetry(ServerInfo info, tiering::Ledger& ledger, const engine::Scheduler& scheduler);

  void set_tiering(std::shared_ptr<const TieringCountersProvider> provider);
  void set_gpu(std::shared_ptr<const GpuCountersProvider> provider);
  // A finished HTTP exchange (route is the matched pattern, e.g. "/v1/chat/completions"; "other" for 404s).
  void record_request(const std::string& route, int status, double seconds);
  void connection_opened() { connections_.fetch_add(1); }
  void connection_closed() { connections_.fetch_sub(1); }
  void generation_started() { generating_.fetch_add(1); }
  void generation_finished() { generating_.fetch_sub(1); }
  void record_rejected() { rejected_.fetch_add(1); }
  // A request (or connection) the server refused before serving it: reason is a short fixed label, e.g.
  // "host_not_allowed", "unauthorized", "body_too_large", "queue_full", "over_capacity".
  void record_refusal(const std::string& reason);

  boost::json::object health() const;
  std::string metrics() const;
  boost::json::object snapshot(TelemetryCursor& cursor) const;
  const ServerInfo& info() const { return info_; }
  tiering::Ledger& ledger() const { return ledger_; }  // for components the server adds (grammar masks)

 private:
  TieringCounters tiering() const;
  GpuCounters gpu() const;

  ServerInfo info_;
  tiering::Ledger& ledger_;
  const engine::Scheduler& scheduler_;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mutex_;
  std::shared_ptr<const TieringCountersProvider> tiering_;
  std::shared_ptr<const GpuCountersProvider> gpu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (route, status) -> count
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  std::map<std::string, std::array<uint64_t, kBuckets.size() + 1>> latency_;  // per route, cumulative at render
  std::map<std::string, double> latency_sum_;
  std::map<std::string, uint64_t> refusals_;  // reason -> count
  std::atomic<int64_t> connections_{0}, generating_{0};
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace tierlm::server
