// calibrate/apply_plan.cpp — Plan -> ExpertTierOptions.
#include "calibrate/apply_plan.h"

#include <algorithm>
#include <stdexcept>

#include "runtime/kv/codec.h"

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
  o.cpu_expert_rows = plan.gpu_cpu_expert_rows;
  // The sequences the planner sized the device KV and recurrent states for (serve sets its max_batch again).
  o.max_sequences = std::max<int64_t>(1, plan.batch);
  for (int64_t l = 0; l < int64_t(plan.gpu_resident_experts.size()) && l < plan.gpu_layers; ++l)
    for (int32_t e : plan.gpu_resident_experts[size_t(l)]) o.resident_experts.emplace_back(l, e);
  return o;
}

void apply_kv_codec_to_gpu(const std::string& codec, gpu::GpuOptions& options) {
  switch (kv::parse_codec(codec)) {  // throws on an unknown name
    case kv::Codec::f32:
      options.kv_codec = gpu::GpuKvCodec::f32;
      options.widen_dense_weights = true;
      return;
    case kv::Codec::f16:
      options.kv_codec = gpu::GpuKvCodec::f16;
      return;
    case kv::Codec::q8:
      options.kv_codec = gpu::GpuKvCodec::q8;
      return;
    case kv::Codec::turbo3:
    case kv::Codec::turbo4:
      break;
  }
  throw std::invalid_argument("--kv-codec " + codec + ": the GPU layers' device KV takes f32, f16 or q8, not " +
                              codec + "; pick one of those, or --gpu-layers 0 to keep every layer on the CPU");
}

}  // namespace tierlm::calibrate
