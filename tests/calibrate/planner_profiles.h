// tests/calibrate/planner_profiles.h — the synthetic device and model profiles the planner tests share: devices from
// profiles/devices/*.json, and model profiles built from published model shapes (no weights needed).
#pragma once

#include <string>

#include "calibrate/planner.h"

namespace tierlm::calibrate::test_profiles {

inline std::string devices_dir() { return std::string(TIERLM_SOURCE_DIR) + "/profiles/devices/"; }

inline DeviceProfile device(const std::string& name) { return load_device_profile(devices_dir() + name + ".json"); }

// Qwen3-30B-A3B's shape with q4 experts and q8_0 dense weights.
inline ModelProfile qwen3_moe_30b() {
  model::ModelConfig c;
  c.model_type = "qwen3_moe";
  c.arch = *model::find_architecture("qwen3_moe");
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_layers = 48;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  ModelProfile p = model_profile_from_config(c, kernels::WeightFormat::q8_0, kernels::WeightFormat::q4);
  p.fingerprint = "qwen3moe30b";
  return p;
}

// Llama-3.1-8B's shape, q4.
inline ModelProfile llama_8b() {
  model::ModelConfig c;
  c.model_type = "llama";
  c.arch = *model::find_architecture("llama");
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  ModelProfile p = model_profile_from_config(c, kernels::WeightFormat::q4, kernels::WeightFormat::q4);
  p.fingerprint = "llama8b";
  return p;
}

}  // namespace tierlm::calibrate::test_profiles
