// runtime/model/moe_model.h — the bridge between a MoE model folder and the expert tier: where each expert's
// tensors are in the safetensors files (per-expert Hugging Face names, or slices of MLX's stacked switch_mlp
// tensors), opening the tier for load_model, and `tierlm pack` (experts rewritten expert-major, 4 KiB aligned,
// already in the in-memory format, so a miss is one read with no conversion).
// Never: read expert bytes at load time (the tier reads them on demand), except for pack.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"
#include "tiering/expert_store.h"
#include "tiering/expert_tier.h"

namespace tierlm::model {

// The experts of `config` as found in `index`. slot_format: the in-memory format (nullopt: the file's dense dtype;
// MLX files always keep their MLX format). Throws ModelError naming the first missing or mis-shaped tensor.
tiering::ExpertStore expert_store_from_safetensors(const TensorIndex& index, const ModelConfig& config,
                                                   std::optional<kernels::WeightFormat> slot_format);

// The tier load_model attaches to a MoE model: a packed expert file when given or present as DIR/experts.tierlm
// (checked against the config), else the safetensors themselves.
std::shared_ptr<tiering::ExpertTier> open_expert_tier(const std::filesystem::path& dir, const TensorIndex& index,
                                                      const ModelConfig& config, const LoadOptions& options,
                                                      tiering::Ledger& ledger);

// Writes the packed expert file for the model in `dir` (default output DIR/experts.tierlm) in `format`.
struct PackResult {
  std::filesystem::path path;
  int64_t experts = 0;
  uint64_t expert_bytes = 0, file_bytes = 0;
};
PackResult pack_experts(const std::filesystem::path& dir, std::optional<kernels::WeightFormat> format,
                        const std::filesystem::path& out = {},
                        const std::function<void(size_t, size_t)>& progress = {});

}  // namespace tierlm::model
