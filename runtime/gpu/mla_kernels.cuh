// runtime/gpu/mla_kernels.cuh — internal: launchers of DeepSeek's multi-head latent attention kernels
// (mla_kernels.cu), in plain types so gpu_layers.cpp compiles with the host compiler. The same absorbed form as the
// CPU's engine::MlaAttention (runtime/engine/mla.h), for prefill and decode alike:
//   the latent cache keeps per position [rms_norm(kv_a latent) (kv_lora_rank) | RoPE(k_rope) (rope dims)], nothing
//   per head; per head q_latent = W_uk[h]ᵀ q_nope, score_t = (q_latent · latent_t + RoPE(q_rope) · k_rope_t) * scale,
//   out_h = W_uv[h] · Σ_t softmax(score)_t latent_t.
// Every launcher enqueues on `stream` and returns; none allocates or synchronizes. Never: included outside
// runtime/gpu.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "runtime/gpu/device_kernels.cuh"

namespace tierlm::gpu::device {

struct MlaParams {
  int64_t heads = 0, nope = 0, rope = 0, lora = 0, v = 0;  // qk_nope / qk_rope / kv_lora_rank / v_head_dim
  float norm_eps = 1e-6f;            // kv_a_layernorm's (the RMSNorm default, not rms_norm_eps)
  const float* kv_norm = nullptr;    // kv_a_layernorm's weight (lora floats)
  const float* inv_freq = nullptr;   // rope/2 floats: the host Rope's table for the rope dims
  float rope_scale = 1.0f;           // cos and sin times this (YaRN's attention factor), as engine::Rope
  float softmax_scale = 0;           // qk_head_dim^-0.5 (x YaRN's mscale^2 where the definition applies it)
  const float* key = nullptr;        // kv_b_proj's K half, f32 [heads][lora][nope]
  const float* value = nullptr;      // kv_b_proj's V half, f32 [heads][v][lora]
  __host__ __device__ int64_t latent_floats() const { return lora + rope; }
};

// The paged latent cache of one layer: [pages][kKvPage][lora + rope] values in the codec (0 f16, 2 f32: KvRef's
// codes; q8 is refused by the caller).
struct LatentKv {
  void* rows = nullptr;
  int codec = 0;
};
inline int64_t latent_row_bytes(int codec, int64_t floats) { return floats * (codec == 2 ? 4 : 2); }

// Row i of `kv_a` (rows x ld floats; its [latent | k_rope] at column 0): latent rms-normed with kv_norm, k_rope
// turned (rotate_half) at positions[i], both written to the row's sequence's pages at positions[i].
void mla_store_latent(const float* kv_a, int64_t ld, int64_t rows, const MlaParams& p, const int32_t* positions,
                      const LatentKv& kv, const PageTables& tables, cudaStream_t stream);
// Per row i and head h of q (rows x ldq floats, per head [nope | rope]): q_latent[(i*heads + h)*lora ..] =
// W_uk[h]ᵀ q_nope and q_rope[(i*heads + h)*rope ..] = RoPE(q's rope dims) at positions[i].
void mla_query(const float* q, int64_t ldq, int64_t rows, const MlaParams& p, const int32_t* positions,
               float* q_latent, float* q_rope, cudaStream_t stream);
// out[(i*heads + h)*v ..] = W_uv[h] · the softmax mix of latents over positions [0, positions[i]] of the row's
// sequence (every row's latent stored first, by mla_store_latent).
void mla_attention(const float* q_latent, const float* q_rope, int64_t rows, const MlaParams& p,
                   const int32_t* positions, const LatentKv& kv, const PageTables& tables, float* out,
                   cudaStream_t stream);
// The same in the split form for few rows (decode): a block per (row, head, chunk of positions), at most 32 chunks
// over max_len (the longest position + 1 of any row), merged by a second kernel, so that one row's attention fills
// the GPU. scratch: mla_split_scratch_floats(rows, p, max_len) floats. Worth it while rows * heads blocks leave SMs
// idle: rows <= mla_split_rows(heads).
int64_t mla_split_scratch_floats(int64_t rows, const MlaParams& p, int64_t max_len);
inline int64_t mla_split_rows(int64_t heads) { return heads >= 256 ? 1 : 256 / heads; }
void mla_attention_split(const float* q_latent, const float* q_rope, int64_t rows, const MlaParams& p,
                         const int32_t* positions, const LatentKv& kv, const PageTables& tables, int64_t max_len,
                         float* scratch, float* out, cudaStream_t stream);

}  // namespace tierlm::gpu::device
