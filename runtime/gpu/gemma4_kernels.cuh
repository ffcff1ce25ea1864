// runtime/gpu/gemma4_kernels.cuh — internal: launchers of Gemma 4's own kernels (gemma4_kernels.cu), with the CPU's
// arithmetic (runtime/engine/forward.cpp: the attention rows' q/k norms, v_norm, RoPE and query scaling; the sandwich
// norms, GeGLU, the router input, the per-layer input gate and layer_scalar; runtime/engine/ops.cpp soft_cap).
// Plain types, so gpu_layers.cpp compiles with the host compiler; every launcher enqueues on `stream` and returns.
// Never: included outside runtime/gpu; never allocates or synchronizes.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tierlm::gpu::device {

// One Gemma 4 attention layer's row preparation. The projection's rows (stride ld_proj) hold q (heads x head_dim),
// then, for a layer with KV of its own, k (kv_heads x head_dim) and v (none with k_eq_v: the values are k's
// projection). Writes qkv rows of stride (heads + 2 kv_heads) x head_dim (the attention kernels' layout): q =
// rope(q_norm(q)) * q_scale; own KV: k = rope(k_norm(k)), v = v_norm(v) (RMS over the head, no weight), k and v
// before any norm or rope when k_eq_v. A KV-shared layer (own_kv false) writes q alone. The RoPE: rotate_half over
// dims [0, rotary_dim) at positions[i] with inv_freq (rotary_dim / 2 floats; Gemma 4's proportional rope: zeros past
// its rotated pairs).
struct Gemma4QkvParams {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool own_kv = true, k_eq_v = false;
  const float* q_norm = nullptr;  // head_dim floats
  const float* k_norm = nullptr;  // head_dim floats (own KV)
  float eps = 1e-6f;
  const float* inv_freq = nullptr;
  int64_t rotary_dim = 0;
  float q_scale = 1.0f;
};
void gemma4_qkv(const float* proj, int64_t ld_proj, int64_t rows, const Gemma4QkvParams& p, const int32_t* positions,
                float* qkv, cudaStream_t stream);

// y[i] += rms_norm(x[i]) * weight, rows of `width` (x stride ldx, y stride ldy).
void rms_norm_add(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t width, float eps, float* y,
                  int64_t ldy, cudaStream_t stream);
// out[i][j] = gelu_tanh(gu[i][j]) * gu[i][I + j] (GeGLU over [gate | up] rows of 2I).
void gelu_gate(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream);
// gate[i][j] = gelu_tanh(gate[i][j]) * inputs[i * ld_inputs + j], rows of `width` (the per-layer input gate).
void gelu_times(float* gate, int64_t rows, int64_t width, const float* inputs, int64_t ld_inputs, cudaStream_t stream);
// out[i] = rms_norm_unscaled(x[i]) * scale * root (the MoE router's input), rows of `width`.
void router_input(const float* x, int64_t rows, int64_t width, const float* scale, float root, float eps, float* out,
                  cudaStream_t stream);
// x[i] *= s for i < count.
void scale(float* x, int64_t count, float s, cudaStream_t stream);
// x[i] = tanh(x[i] / cap) * cap for i < count (final_logit_softcapping).
void soft_cap(float* x, int64_t count, float cap, cudaStream_t stream);

}  // namespace tierlm::gpu::device
