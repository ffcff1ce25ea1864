// server/gpu_layers_counters.h — adapts the GPU layers (gpu::GpuLayers: its VRAM ledger and VRAM expert tier
// counters) to the server's GpuCountersProvider. GpuLayers belongs to the engine thread once the scheduler runs, so
// refresh() copies its numbers there (wired to SchedulerOptions::after_step) and gpu_counters() hands the copy to any
// thread. Never: calls into GpuLayers from gpu_counters().
#pragma once

#include <memory>
#include <mutex>

#include "server/telemetry.h"

namespace tierlm::gpu {
class GpuLayers;
}

namespace tierlm::server {

class GpuLayersCounters : public GpuCountersProvider {
 public:
  // Takes the first copy: construct it before the scheduler starts (or on the engine thread).
  GpuLayersCounters(std::shared_ptr<gpu::GpuLayers> gpu, int64_t model_layers);
  void refresh();  // engine thread only (a ledger snapshot and four counters: microseconds against a step's ms)
  GpuCounters gpu_counters() const override;

 private:
  std::shared_ptr<gpu::GpuLayers> gpu_;
  const int64_t model_layers_;
  mutable std::mutex mutex_;
  GpuCounters copy_;
};

}  // namespace tierlm::server
