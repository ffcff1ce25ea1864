// runtime/model/synthetic_moe.h — a random-weight Qwen3-MoE-shaped model written to disk as a real model folder
// (config.json, model.safetensors with the dense f32 weights, experts.tierlm with pre-quantized experts), for the
// memory-budget tests and the expert-tier benchmark: a model larger than memory without a download.
// Deterministic for a seed. Never: used by the serving path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "runtime/kernels/weights.h"

namespace tierlm::model {

struct SyntheticMoeSpec {
  int64_t layers = 48, experts = 128, top_k = 8, hidden = 2048, expert_intermediate = 768;
  int64_t heads = 32, kv_heads = 4, head_dim = 128, vocab = 8192;
  kernels::WeightFormat expert_format = kernels::WeightFormat::q4;
  uint64_t seed = 1;
};

// Bytes of experts.tierlm for the spec.
uint64_t synthetic_moe_expert_bytes(const SyntheticMoeSpec& spec);
void write_synthetic_moe(const std::filesystem::path& dir, const SyntheticMoeSpec& spec,
                         const std::function<void(size_t, size_t)>& progress = {});

}  // namespace tierlm::model
