// runtime/model/model.h — the weights of a dense decoder model, loaded from a Hugging Face folder into ledger-owned
// kernel formats. q/k/v and gate/up are fused row-wise at load so decode makes fewer, larger matvec calls.
// Never: keep a pointer into the mmap'd files after load (all weights are copied/converted into the ledger).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/kernels/weights.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "tiering/expert_tier.h"
#include "tiering/ledger.h"

namespace tierlm::model {

struct LayerWeights {
  // Attention layers: rows [q (heads*head_dim) | k (kv*head_dim) | v (kv*head_dim)], this layer's head_dim and kv
  // heads; with an output gate (arch.attention_output_gate) q_proj's rows as stored: per head [query | gate]; k_eq_v
  // layers have no v rows (values are the keys' projection), KV-shared layers (kv_source) only q rows.
  kernels::Weight qkv;
  std::vector<float> qkv_bias;            // empty unless arch.qkv_bias
  std::vector<float> q_norm, k_norm;      // head_dim each, empty unless arch.qk_norm
  kernels::Weight o;                       // the mixer's output projection (o_proj, or a DeltaNet's out_proj)
  std::vector<float> o_bias;              // hidden floats, empty unless config.o_bias
  // Gated DeltaNet layers (LayerSpec::mixer == gated_deltanet), in place of qkv:
  kernels::Weight linear_in;              // rows: [qkv (conv_dim) | z (value_dim) | b (value_heads) | a (value_heads)]
  std::vector<float> conv;                // conv_dim x kernel; conv[c*kernel + j] weighs input t - (kernel-1) + j
  std::vector<float> decay_rate;          // value_heads: -exp(A_log)
  std::vector<float> dt_bias;             // value_heads
  std::vector<float> gated_norm;          // value_head_dim: RMSNormGated's weight (plain, not zero-centred)
  std::vector<float> input_norm, post_attention_norm;
  // MLA layers (LayerSpec::mixer == mla; runtime/model/mla_weights.h says what each holds), with o:
  kernels::Weight mla_in;                 // rows [q_a (q_lora_rank) or q (heads * qk_head_dim) | kv_a (lora + rope)]
  kernels::Weight q_b;                    // empty without q LoRA
  std::vector<float> q_a_norm, kv_a_norm;
  tiering::LedgerBuffer kv_b_key;         // f32 [heads][kv_lora_rank][qk_nope_head_dim]
  tiering::LedgerBuffer kv_b_value;       // f32 [heads][v_head_dim][kv_lora_rank]
  // Dense MLP layers (LayerSpec::mlp == dense): the MLP; MoE layers leave these empty.
  kernels::Weight gate_up;                // rows: [gate (intermediate) | up (intermediate)]
  kernels::Weight down;
  std::vector<float> gate_up_bias, down_bias;  // empty unless config.mlp_bias
  // MoE layers (LayerSpec::mlp == moe): the router and the optional shared expert; the routed experts live in the expert tier.
  kernels::Weight router;                 // [num_experts x hidden]
  std::vector<float> router_bias;         // num_experts floats (gpt-oss), else empty
  std::vector<float> sinks;               // per query head: the attention sink logit (gpt-oss), else empty
  kernels::Weight shared_gate_up;         // rows: [gate | up] (shared_expert_intermediate_size each)
  kernels::Weight shared_down;
  std::vector<float> shared_expert_gate;  // hidden floats: sigmoid(. x) scales the shared expert's output; empty:
                                          // the shared experts are added ungated (DeepSeek)
  std::vector<float> score_correction_bias;  // num_experts floats (DeepSeek-V3): added to the scores for choosing
  // Gemma 4 (arch.gemma4): the feed-forward sandwich norms, the MoE's own norms and router scales, the per-layer
  // input (PLE) gate and projection, and the layer's output scalar. post_attention_norm then norms the attention
  // output before the residual add.
  std::vector<float> pre_feedforward_norm, post_feedforward_norm;
  std::vector<float> post_feedforward_norm_1, pre_feedforward_norm_2, post_feedforward_norm_2;  // MoE layers
  std::vector<float> router_scale;        // hidden floats: router input = rms_norm(x) * router_scale / sqrt(hidden)
  std::vector<float> per_expert_scale;    // num_experts floats: multiplies the renormalized top-k weights
  kernels::Weight per_layer_input_gate;   // [per_layer_input_size x hidden]
  kernels::Weight per_layer_projection;   // [hidden x per_layer_input_size]
  std::vector<float> post_per_layer_input_norm;
  float layer_scalar = 1.0f;
};

struct ModelWeights {
  ModelConfig config;
  kernels::Weight embed;
  kernels::Weight lm_head;                // empty (rows == 0) when tied to embed
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  std::shared_ptr<tiering::ExpertTier> experts;  // MoE models only: where the routed experts come from
  // Gemma 4 per-layer inputs (config.per_layer_input_size > 0): the packed per-layer token embedding
  // [per_layer_vocab x layers * P], the projection of the embedding [layers * P x hidden] and its norm (P floats).
  kernels::Weight embed_per_layer;
  kernels::Weight per_layer_model_projection;
  std::vector<float> per_layer_projection_norm;
  const kernels::WeightView& output() const { return lm_head.view.rows ? lm_head.view : embed.view; }
  uint64_t bytes() const;
};

struct LoadOptions {
  // Format for dense matrices; nullopt keeps the file's precision (f32/f16/bf16). MLX-quantized files stay MLX.
  std::optional<kernels::WeightFormat> weight_format;
  tiering::Ledger* ledger = nullptr;  // defaults to Ledger::global()
  std::function<void(size_t done, size_t total)> progress;  // called after each tensor group
  // MoE models: cache/reader settings of the expert tier; the experts' in-memory format (nullopt: weight_format,
  // else the file's); a packed expert file (default: DIR/experts.tierlm when it exists; "" to ignore it).
  tiering::ExpertTierOptions experts;
  std::optional<kernels::WeightFormat> expert_format;
  std::optional<std::filesystem::path> packed_experts;
};

ModelWeights load_model(const std::filesystem::path& model_dir, const LoadOptions& options = {});

}  // namespace tierlm::model
