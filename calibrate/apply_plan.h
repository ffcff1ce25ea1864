// calibrate/apply_plan.h — a Plan mapped onto the runtime's own option structs: the expert tier's cache and reader
// settings (resident set, slots, policy, prefetch, queue depth, block size, O_DIRECT), and the GPU layers with their
// VRAM expert set and device KV codec. The engine's scalar settings
// (threads, prefill chunk, KV codec, budget) are read straight off the Plan by the commands that build it.
// Never: reach into a running engine; plans apply at construction.
#pragma once

#include <string>

#include "calibrate/planner.h"
#include "runtime/gpu/gpu_layers.h"
#include "tiering/expert_tier.h"

namespace tierlm::calibrate {

tiering::ExpertTierOptions expert_tier_options(const Plan& plan);
// layers = plan.gpu_layers (0: no GPU), resident experts and slots of the VRAM tier, device KV codec, VRAM budget.
gpu::GpuOptions gpu_options(const Plan& plan);
// A KV codec the user named (--kv-codec) applied to the GPU layers too, so it is never silently the plan's device KV:
// f32 is the exact configuration (f32 device KV, dense weights widened to f32 for the GEMMs), f16 and q8 are
// themselves; turbo3 / turbo4 have no device form: std::invalid_argument naming the codec and what to do.
void apply_kv_codec_to_gpu(const std::string& codec, gpu::GpuOptions& options);

}  // namespace tierlm::calibrate
