// server/expert_tier_counters.h — adapts the MoE expert tier's telemetry (tiering::ExpertTierTelemetry) to the
// server's TieringCountersProvider. The tier's counters belong to the engine thread, so refresh() copies them there
// (wired to SchedulerOptions::after_step) and counters() hands the copy to any thread.
#pragma once

#include <memory>
#include <mutex>

#include "server/telemetry.h"
#include "tiering/expert_tier.h"

namespace tierlm::server {

class ExpertTierCounters : public TieringCountersProvider {
 public:
  explicit ExpertTierCounters(std::shared_ptr<tiering::ExpertTier> tier);
  void refresh();  // engine thread only (a copy of a few counters per layer: microseconds against a step's ms)
  TieringCounters counters() const override;

 private:
  std::shared_ptr<tiering::ExpertTier> tier_;
  uint64_t disk_bytes_ = 0;  // every routed expert's bytes on disk
  mutable std::mutex mutex_;
  TieringCounters copy_;
};

}  // namespace tierlm::server
