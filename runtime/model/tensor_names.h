// runtime/model/tensor_names.h — where a checkpoint keeps the language model's tensors: a causal LM ("model."),
// the text tower of a ConditionalGeneration checkpoint ("model.language_model."), or mlx-lm / mlx-vlm's tree
// ("language_model.model.", head "language_model.lm_head"). Tensors of other towers (vision "model.visual.*",
// "vision_tower.*") and multi-token-prediction heads ("mtp.*") are skipped by name: the loader never reads them.
// Never: guess; a folder with none of the known layouts is an error naming what was looked for.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/model/safetensors.h"

namespace tierlm::model {

struct TensorNames {
  std::string model = "model.";   // prefix of embed_tokens, norm and layers.N
  std::string lm_head = "lm_head";
  bool mlx_tree = false;          // mlx-lm / mlx-vlm naming (their sanitize already applied: norms +1, conv [C,K,1])
  std::string layer(int64_t i) const { return model + "layers." + std::to_string(i) + "."; }
};

// Finds the layout by its embed_tokens tensor ("<prefix>embed_tokens.weight").
TensorNames find_tensor_names(const TensorIndex& index);
// Logs how many tensors of other towers and mtp heads the load leaves unread.
void log_skipped_tensors(const TensorIndex& index);

}  // namespace tierlm::model
