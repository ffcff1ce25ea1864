#include "server/expert_tier_counters.h"

namespace tierlm::server {

ExpertTierCounters::ExpertTierCounters(std::shared_ptr<tiering::ExpertTier> tier) : tier_(std::move(tier)) {
  const auto& store = tier_->store();
  for (int64_t l = 0; l < store.layers(); ++l)
    for (int64_t e = 0; e < store.experts(); ++e) disk_bytes_ += store.read_bytes(l, e);
  copy_.available = true;
  copy_.source = "expert_tier";
  copy_.bytes_by_tier["disk"] = disk_bytes_;
}

void ExpertTierCounters::refresh() {
  const tiering::ExpertTierTelemetry t = tier_->telemetry();
  TieringCounters c;
  c.available = true;
  c.source = "expert_tier";
  c.disk_bytes_read = t.bytes_read;
  c.disk_reads = t.reads;
  c.cache_hits = t.hits;
  c.cache_misses = t.misses;
  c.prefetches = t.prefetches;
  c.prefetch_hits = t.prefetch_hits;
  c.prefetch_wasted = t.prefetch_wasted;
  c.prefetch_skipped = t.prefetch_skipped;
  c.prefetch_precision = t.prefetch_precision;
  c.evictions = t.evictions;
  c.read_stall_seconds = t.read_stall_seconds;
  c.conversions = t.conversions;
  c.conversion_seconds = t.conversion_seconds;
  c.inline_conversions = t.inline_conversions;
  c.inline_conversion_seconds = t.inline_conversion_seconds;
  c.conversion_wait_seconds = t.conversion_wait_seconds;
  c.moe_seconds = t.moe_seconds;
  c.expert_compute_seconds = t.expert_compute_seconds;
  c.expert_read_errors = t.read_errors;
  c.bytes_by_tier["disk"] = disk_bytes_;
  std::lock_guard lock(mutex_);
  copy_ = std::move(c);
}

TieringCounters ExpertTierCounters::counters() const {
  std::lock_guard lock(mutex_);
  return copy_;
}

}  // namespace tierlm::server
