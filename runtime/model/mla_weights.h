// runtime/model/mla_weights.h — loading one DeepSeek MLA layer's attention (Mixer::mla) into the forms the engine's
// MlaAttention (runtime/engine/mla.h) computes with:
//   mla_in      rows [q_a_proj (q_lora_rank) | kv_a_proj_with_mqa (kv_lora_rank + rope)], or [q_proj | kv_a...]
//               without q LoRA: one pass over the normed hidden state;
//   q_b         q_b_proj (absent without q LoRA);
//   kv_b_key    kv_b_proj's K half transposed per head, f32 [heads][kv_lora_rank][qk_nope_head_dim]: absorbs a
//               head's q_nope into latent space, so attention runs over the cached latents;
//   kv_b_value  kv_b_proj's V half, f32 [heads][v_head_dim][kv_lora_rank]: a head's output from its latent mix;
//   o           o_proj.
// RoPE: the definition rotates interleaved pairs (2j, 2j+1) of q_rot and k_rot (deepseek_v2's complex product,
// deepseek_v3's rope_interleave). Permuting the rope rows of q and kv_a to [even | odd] at load turns that into the
// rotate_half layout engine::Rope applies, with the same q.k (both sides are permuted alike).
// mlx-community folders (mlx_matrix.h): the projections may be MLX-quantized, kept so with their rows reordered as
// stored. What mlx-lm writes (ml-explore/mlx-lm @ d78bf58):
// - mlx_lm/models/deepseek_v3.py sanitize (since f18526f, "DSV3 MLA", 2026-02-04) splits kv_b_proj per head into
//   embed_q [heads, kv_lora_rank, qk_nope_head_dim] (its K half transposed) and unembed_out [heads, v_head_dim,
//   kv_lora_rank] (its V half), mlx_lm/models/mla.py MultiLinear, quantized along their last axis; older conversions
//   (most mlx-community DeepSeek-V3/R1/Kimi-K2 folders) and mlx_lm/models/deepseek_v2.py keep kv_b_proj. Either form
//   is read here, dequantized to f32 (current mlx-lm re-quantizes an old folder's halves; we keep the stored values).
// - Both use RoPE with traditional=True on HF's row order (no permutation in sanitize), stack experts.{e}.* into
//   mlp.switch_mlp.{gate,up,down}_proj, keep the router mlp.gate.weight a bare (unquantized) parameter and
//   e_score_correction_bias in f32 (cast_predicate), and have no quant_predicate: every Linear, MultiLinear and the
//   embedding whose input dim is a multiple of the group is quantized, the rest stays float.
// Never: keep pointers into the safetensors mapping; allocate outside the ledger.
#pragma once

#include <optional>
#include <string>

#include "runtime/kernels/weights.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/safetensors.h"
#include "tiering/ledger.h"

namespace tierlm::model {

// Fills l's MLA fields and o from the tensors under `prefix` ("model.layers.N.self_attn."). format: the dense
// matrices' format (nullopt: the file's precision; MLX modules stay MLX); kv_b is kept in f32 for the absorbed
// products.
void load_mla_layer(const TensorIndex& index, const ModelConfig& config, const std::string& prefix,
                    std::optional<kernels::WeightFormat> format, tiering::Ledger& ledger, LayerWeights& l);

// The de-interleaving permutation of `rope` dims: new position i holds old dim rope_source(i, rope).
inline int64_t rope_source(int64_t i, int64_t rope) { return i < rope / 2 ? 2 * i : 2 * (i - rope / 2) + 1; }

}  // namespace tierlm::model
