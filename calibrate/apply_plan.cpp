// calibrate/apply_plan.cpp — Plan -> ExpertTierOptions.
#include "calibrate/apply_plan.h"

#include <algorithm>

namespace tierlm::calibrate {

tiering::ExpertTierOptions expert_tier_options(const Plan& plan) {
  tiering::ExpertTierOptions o;
  o.cache.slots = std::max<int64_t>(1, plan.cache_slots);
  o.cache.policy = tiering::parse_policy(plan.cache_policy);
  o.cache.prefetch_limit = plan.prefetch_limit;
  o.cache.resident.clear();
  for (int64_t l = 0; l < int64_t(plan.resident_experts.size()); ++l)
    for (int32_t e : plan.resident_experts[size_t(l)]) o.cache.resident.emplace_back(l, e);
  o.reader.queue_depth = std::max(1u, plan.reader_queue_depth);
  o.reader.block_size = std::max<uint64_t>(4096, plan.reader_block_size);
  o.reader.direct = plan.reader_direct;
  return o;
}

gpu::GpuOptions gpu_options(const Plan& plan) {
  gpu::GpuOptions o;
  o.layers = plan.gpu_layers;
  o.kv_codec = plan.gpu_kv_codec == "q8" ? gpu::GpuKvCodec::q8 : gpu::GpuKvCodec::f16;
  o.vram_budget = plan.gpu_budget_bytes;
  o.expert_slots = plan.gpu_expert_slots;
  for (int64_t l = 0; l < int64_t(plan.gpu_resident_experts.size()) && l < plan.gpu_layers; ++l)
    for (int32_t e : plan.gpu_resident_experts[size_t(l)]) o.resident_experts.emplace_back(l, e);
  return o;
}

}  // namespace tierlm::calibrate
