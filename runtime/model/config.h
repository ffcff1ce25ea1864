// runtime/model/config.h — a model's config.json as a typed ModelConfig, plus the architecture table that says, as
// data, how each supported model_type's block is built (which tensors, which attention/MLP variant).
// Never: guess silently. Unknown architectures and unsupported options are load-time errors naming the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model/layer_spec.h"

namespace tierlm::model {

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | proportional
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // The first head_dim * factor dims rotate, the rest pass through (qwen3_5); with type proportional (Gemma 4's full
  // layers) rotate_half still pairs across all of head_dim and only the first factor * head_dim / 2 pairs turn.
  double partial_rotary_factor = 1.0;
  // yarn (gpt_oss; transformers' _compute_yarn_parameters): the correction range from beta_fast / beta_slow over
  // original_max_position_embeddings, floored/ceiled when truncate; cos and sin are multiplied by attention_factor.
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;
};

// Gated DeltaNet layers (qwen3_5 "linear_attention"), from the linear_* keys. Per sequence and layer the state is a
// causal conv1d window (conv_dim x (kernel - 1)) and the recurrent state (value_heads x key_head_dim x
// value_head_dim), in f32.
struct DeltaNetConfig {
  int64_t conv_kernel = 0, key_heads = 0, value_heads = 0, key_head_dim = 0, value_head_dim = 0;
  int64_t key_dim() const { return key_heads * key_head_dim; }
  int64_t value_dim() const { return value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels of [q | k | v]
  int64_t conv_state_floats() const { return conv_dim() * (conv_kernel - 1); }
  int64_t recurrent_state_floats() const { return value_heads * key_head_dim * value_head_dim; }
  uint64_t state_bytes() const { return uint64_t(conv_state_floats() + recurrent_state_floats()) * sizeof(float); }
};

// DeepSeek-V2/V3 multi-head latent attention (Mixer::mla), from the config's MLA keys. Per head the query is
// [nope | rope] (qk_head_dim), keys are kv_b_proj's K half of the normalized latent plus one roped key shared by every
// head, values its V half (v_head_dim).
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: q_proj straight from the hidden state (deepseek_v2 with q_lora_rank null)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  double softmax_scale = 0;  // qk_head_dim^-0.5 (times the YaRN mscale^2 where the definition applies it)
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // What one position of one layer holds in the latent cache: the latent and the roped key.
  int64_t latent_floats() const { return kv_lora_rank + qk_rope_head_dim; }
  // What the same position would hold uncompressed: every head's key and value.
  int64_t uncompressed_floats(int64_t heads) const { return heads * (qk_head_dim() + v_head_dim); }
};

// How a MoE router turns logits into the top-k (DeepSeek's routers; other families keep the defaults: softmax over
// every expert, plain top-k).
struct RouterConfig {
  enum class Scoring : uint8_t { softmax, sigmoid } scoring = Scoring::softmax;
  // Group-limited top-k: experts form n_group consecutive groups; only the topk_group best groups may be chosen. A
  // group's score is the sum of its two best (bias-corrected) scores (deepseek_v3 noaux_tc) or its best score
  // (deepseek_v2 group_limited_greedy).
  enum class Groups : uint8_t { none, top2_sum, max } groups = Groups::none;
  int64_t n_group = 1, topk_group = 1;
  bool score_correction_bias = false;  // e_score_correction_bias added to the scores for choosing only
  double routed_scaling_factor = 1.0;  // multiplies the chosen weights (after any renormalization)
};

// MLX quantization ("quantization": {"group_size", "bits", "mode"}): mode "affine" (uint32 words + scales + biases,
// 4 or 8 bits; the default, older folders have no mode) or "mxfp4" (group 32, 4-bit E2M1 codes in uint32 words,
// uint8 E8M0 scales, no biases: mlx-lm's gpt-oss experts). A per-module entry without "mode" is affine whatever the
// top level says (mlx's to_quantized default), and takes its mode's default group size and bits when it omits them.
struct QuantizationConfig {
  int group_size = 0;
  int bits = 0;
  // Per-module entries (mlx-lm's quant_predicate, e.g. "language_model.model.layers.0.mlp.gate": 8 bits).
  struct Module {
    int group_size = 0;
    int bits = 0;
    bool mxfp4 = false;
  };
  std::map<std::string, Module> modules;
  bool mxfp4 = false;  // the top level's mode
  Module of(const std::string& module) const {
    auto it = modules.find(module);
    return it != modules.end() ? it->second : Module{group_size, bits, mxfp4};
  }
  // What most quantized dense modules are: the top level, or (a top level in mxfp4 that only the experts take, as
  // mlx-lm writes gpt-oss) the most common per-module entry. For sizing (calibrate's fit), not for loading.
  Module dense() const;
};

// The per-architecture description: how the block differs between families.
struct ArchitectureSpec {
  std::string model_type;
  bool qkv_bias = false;        // q/k/v projections carry a bias (qwen2)
  bool qk_norm = false;         // RMSNorm over head_dim of q and k before RoPE (qwen3)
  bool moe = false;             // sparse MLP (handled by the MoE tier)
  // MoE variants (only read when moe):
  bool qk_norm_full_width = false;  // q/k norm weights span the whole projection, not one head (olmoe)
  bool moe_renormalize = false;     // top-k weights always renormalized to sum 1 (mixtral), else norm_topk_prob
  bool shared_expert = false;       // + sigmoid(shared_expert_gate . x) * shared MLP(x) (qwen2_moe)
  const char* moe_block = "mlp";    // module holding the router ("gate") and "experts"
  const char* expert_gate = "gate_proj";  // per-expert tensor names (mixtral: w1 / w3 / w2)
  const char* expert_up = "up_proj";
  const char* expert_down = "down_proj";
  // Config keys the family reads besides the common ones (runtime/model/config_keys.cpp): q/k/v/o biases from
  // attention_bias and gate/up/down biases from mlp_bias (llama), qkv biases from qkv_bias (qwen2_moe).
  bool reads_attention_bias = false;
  bool reads_mlp_bias = false;
  bool reads_qkv_bias = false;
  // Where sliding-window attention comes from: none; `sliding_window` on every layer (mistral, mixtral); or
  // `layer_types` / use_sliding_window + max_window_layers (qwen2). `windows_checked`: a transformers fixture with
  // windowed layers backs it; other families refuse windowed layers by name.
  enum class Sliding : uint8_t { none, every_layer, layer_types } sliding = Sliding::none;
  bool windows_checked = false;
  // Dense MLP layers among sparse ones from mlp_only_layers / decoder_sparse_step (qwen2_moe, qwen3_moe).
  bool reads_sparse_step = false;
  // qwen3_5: `layer_types` mixes linear_attention (Gated DeltaNet) and full_attention, or full_attention_interval
  // says every n-th layer is full; the linear_* keys size the DeltaNet layers.
  bool linear_attention = false;
  // qwen3_5: RMSNorm weights are zero-centred (x * (1 + w)); the loader adds 1 so the forward pass stays one path.
  bool zero_centred_norms = false;
  // qwen3_5: q_proj rows hold [query | gate] per head; the attention output is multiplied by sigmoid(gate).
  bool attention_output_gate = false;
  // The Gemma 4 decoder block (parse_gemma4 in runtime/model/config.cpp reads its keys): sandwich norms
  // (post-attention norm on the attention output, pre/post feed-forward norms), q/k norms and a scale-free v norm,
  // layer_scalar, the dense MLP beside the MoE (enable_moe_block) with its own norms and router, per-layer inputs, KV
  // sharing, attention scaling 1.0, embeddings scaled by sqrt(hidden_size), final logit soft-capping.
  bool gemma4 = false;
  // DeepSeek-V2/V3 (parse_deepseek in runtime/model/config.cpp): MLA layers (ModelConfig::mla), the first
  // first_k_dense_replace layers dense, DeepSeek routing (ModelConfig::router) and ungated shared experts
  // (mlp.shared_experts, n_shared_experts * moe_intermediate_size wide).
  bool mla = false;
  // The gpt-oss block (parse_gpt_oss in runtime/model/config.cpp): attention sinks (a learned logit per query head
  // in the softmax denominator), a router with a bias (mlp.router), experts with biases whose gate/up columns are
  // interleaved (even: gate, odd: up) and the clamped SwiGLU (up + 1) * gate * sigmoid(1.702 * gate), YaRN rope.
  bool gpt_oss = false;
  const char* router = "gate";  // the router's module name under moe_block
};

struct ModelConfig {
  std::string model_type;
  ArchitectureSpec arch;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  std::string hidden_act = "silu";
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype;
  std::optional<QuantizationConfig> quantization;
  // MoE (qwen3_moe, mixtral, olmoe, qwen2_moe); zero for dense models.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;
  // Biases beyond arch.qkv_bias: o_proj (llama-family attention_bias) and gate/up/down (mlp_bias).
  bool o_bias = false;
  bool mlp_bias = false;
  // Gemma 4 (arch.gemma4; neutral values elsewhere).
  double embedding_scale = 1.0;           // embeddings are multiplied by it (sqrt(hidden_size))
  double final_logit_softcapping = 0;     // logits = cap * tanh(logits / cap) when > 0
  double attention_scale = 0;             // softmax scale of q.k; 0: 1/sqrt(head_dim)
  int64_t per_layer_input_size = 0;       // hidden_size_per_layer_input (PLE); 0: none
  int64_t per_layer_vocab_size = 0;       // vocab_size_per_layer_input
  std::optional<RopeConfig> full_attention_rope;  // RoPE of layers whose LayerSpec::full_rope is set
  // gpt-oss (arch.gpt_oss): the SwiGLU clamp (7.0 as GptOssExperts hard-codes it); 0 elsewhere.
  double swiglu_limit = 0;
  // quantization_config quant_method "mxfp4" (gpt-oss checkpoints): the experts are stored as MXFP4 blocks + e8m0
  // scales (*_blocks, *_scales); everything else (modules_to_not_convert) stays unquantized. Also set for an MLX
  // gpt-oss folder whose experts are in mode mxfp4 (mlx-lm's conversion of those checkpoints).
  bool mxfp4_experts = false;
  DeltaNetConfig deltanet;  // zero unless some layer's mixer is gated_deltanet
  MlaConfig mla;            // zero unless some layer's mixer is mla
  RouterConfig router;
  // One entry per layer (num_layers of them) once parsed; hand-built configs (synthetic models) may leave it empty,
  // and layer() then answers the family default: full attention, and MoE on every layer of MoE families.
  std::vector<LayerSpec> layers;

  // Layer i with its head_dim, kv_heads and intermediate filled in.
  LayerSpec layer(int64_t i) const;
  const RopeConfig& rope_of(int64_t i) const;
  // The widest attention projection of any layer (q rows, kv rows) and dense MLP (scratch sizing).
  int64_t max_q_rows() const;
  int64_t max_kv_rows() const;
  int64_t max_intermediate() const;
  // Layers whose MLP is MoE: the expert tier holds this many layers of experts.
  int64_t sparse_layers() const;
  bool any_windowed() const;
  bool any_recurrent() const;  // some layer keeps a recurrent state (gated_deltanet)
  bool any_mla() const;
  // Rows of the fused attention input projection: [q (| gate) | k | v].
  int64_t attention_input_rows() const {
    return num_heads * head_dim * (arch.attention_output_gate ? 2 : 1) + 2 * num_kv_heads * head_dim;
  }
  // What layer i's per-sequence state costs (runtime/kv/state_spec.h).
  kv::StateSpec state_spec(int64_t i) const;
};

// Parses DIR/config.json; throws ModelError naming the file and field on anything missing, mistyped or unsupported.
ModelConfig load_config(const std::filesystem::path& model_dir);
ModelConfig parse_config(const std::string& json_text, const std::string& origin);

// The table of supported architectures; nullptr when model_type is unknown.
const ArchitectureSpec* find_architecture(const std::string& model_type);
std::vector<std::string> supported_architectures();

}  // namespace tierlm::model
