#include "server/gpu_layers_counters.h"

#include "runtime/gpu/gpu_layers.h"

namespace tierlm::server {

GpuLayersCounters::GpuLayersCounters(std::shared_ptr<gpu::GpuLayers> gpu, int64_t model_layers)
    : gpu_(std::move(gpu)), model_layers_(model_layers) {
  refresh();
}

void GpuLayersCounters::refresh() {
  GpuCounters c;
  c.model_layers = model_layers_;
  c.layers = gpu_->layers();
  c.output_head = gpu_->runs_head();
  c.weight_bytes = gpu_->weight_bytes();
  tiering::Ledger& vram = gpu_->vram_ledger();
  c.vram_budget = vram.budget();
  c.vram_used = vram.used();
  c.vram_peak = vram.peak();
  c.vram_accounts = vram.snapshot();
  const gpu::GpuExpertStats experts = gpu_->expert_stats();
  c.expert_resident_hits = experts.resident_hits;
  c.expert_slot_hits = experts.slot_hits;
  c.expert_misses = experts.misses;
  c.expert_bytes_copied = experts.bytes_copied;
  c.expert_device_routed = experts.device_routed;
  c.expert_cpu = experts.cpu_experts;
  std::lock_guard lock(mutex_);
  copy_ = std::move(c);
}

GpuCounters GpuLayersCounters::gpu_counters() const {
  std::lock_guard lock(mutex_);
  return copy_;
}

}  // namespace tierlm::server
