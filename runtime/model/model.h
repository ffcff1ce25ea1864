// runtime/model/model.h — the weights of a dense decoder model, loaded from a Hugging Face folder into ledger-owned
// kernel formats. q/k/v and gate/up are fused row-wise at load so decode makes fewer, larger matvec calls.
// Never: keep a pointer into the mmap'd files after load (all weights are copied/converted into the ledger).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "runtime/kernels/weights.h"
#include "runtime/model/config.h"
#include "tiering/ledger.h"

namespace tierlm::model {

struct LayerWeights {
  kernels::Weight qkv;                    // rows: [q (heads*head_dim) | k (kv*head_dim) | v (kv*head_dim)]
  std::vector<float> qkv_bias;            // empty unless arch.qkv_bias
  std::vector<float> q_norm, k_norm;      // head_dim each, empty unless arch.qk_norm
  kernels::Weight o;
  std::vector<float> input_norm, post_attention_norm;
  kernels::Weight gate_up;                // rows: [gate (intermediate) | up (intermediate)]
  kernels::Weight down;
};

struct ModelWeights {
  ModelConfig config;
  kernels::Weight embed;
  kernels::Weight lm_head;                // empty (rows == 0) when tied to embed
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  const kernels::WeightView& output() const { return lm_head.view.rows ? lm_head.view : embed.view; }
  uint64_t bytes() const;
};

struct LoadOptions {
  // Format for dense matrices; nullopt keeps the file's precision (f32/f16/bf16). MLX-quantized files stay MLX.
  std::optional<kernels::WeightFormat> weight_format;
  tiering::Ledger* ledger = nullptr;  // defaults to Ledger::global()
  std::function<void(size_t done, size_t total)> progress;  // called after each tensor group
};

ModelWeights load_model(const std::filesystem::path& model_dir, const LoadOptions& options = {});

}  // namespace tierlm::model
