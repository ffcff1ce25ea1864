// runtime/gpu/mla_kernels.cu — DeepSeek's multi-head latent attention on the device (see mla_kernels.cuh), with the
// CPU's arithmetic (runtime/engine/mla.cpp): the latent rms-normed in f32, rotate_half RoPE with the host's
// frequency table and YaRN factor, scores as (q_latent · latent + q_rope · k_rope) * scale, an online softmax
// over the row's positions, the latent mix through W_uv at the end. One block per (row, head): its warps score one
// position each, its threads then fold a tile of positions into the latent mix (one latent dim each).
#include <cuda_fp16.h>

#include <cmath>

#include "runtime/gpu/device_launch.cuh"
#include "runtime/gpu/mla_kernels.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

constexpr int kThreads = 128;  // per block: 4 warps
constexpr int kTile = 128;     // positions scored per pass

__device__ __forceinline__ float warp_total(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (every thread gets it); `shared` holds a float per warp and is free again on return.
__device__ float block_total(float v, float* shared) {
  v = warp_total(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  v = warp_total(v);
  __syncthreads();
  return v;
}

// Element `index` of the latent pool in its codec.
__device__ __forceinline__ float latent_at(const void* rows, int codec, int64_t index) {
  return codec == 2 ? static_cast<const float*>(rows)[index] : __half2float(static_cast<const __half*>(rows)[index]);
}

// First element of position t's latent row in the pool (the row's sequence's page table).
__device__ __forceinline__ int64_t latent_row(const int32_t* table, int64_t t, int64_t floats) {
  return (int64_t(table[t / kKvPage]) * kKvPage + t % kKvPage) * floats;
}

__global__ void store_latent_kernel(const float* kv_a, int64_t ld, MlaParams p, const int32_t* positions, LatentKv kv,
                                    PageTables tables) {
  kernel_entry();
  __shared__ float shared[32];
  const int64_t i = blockIdx.x, lora = p.lora, half = p.rope / 2;
  const float* x = kv_a + i * ld;
  float s = 0;
  for (int64_t j = threadIdx.x; j < lora; j += blockDim.x) s += x[j] * x[j];
  const float inv = rsqrtf(block_total(s, shared) / float(lora) + p.norm_eps);
  const int32_t pos = positions[i];
  const int64_t at = latent_row(tables.pages + int64_t(tables.seq_of_row[i]) * tables.stride, pos, p.latent_floats());
  float* f32 = static_cast<float*>(kv.rows) + at;
  __half* f16 = static_cast<__half*>(kv.rows) + at;
  auto put = [&](int64_t j, float value) {
    if (kv.codec == 2)
      f32[j] = value;
    else
      f16[j] = __float2half_rn(value);
  };
  for (int64_t j = threadIdx.x; j < lora; j += blockDim.x) put(j, p.kv_norm[j] * (x[j] * inv));
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    float sn, cs;
    sincosf(float(pos) * p.inv_freq[j], &sn, &cs);
    cs *= p.rope_scale, sn *= p.rope_scale;
    const float a = x[lora + j], b = x[lora + j + half];
    put(lora + j, a * cs - b * sn);
    put(lora + j + half, b * cs + a * sn);
  }
}

__global__ void query_kernel(const float* q, int64_t ldq, MlaParams p, const int32_t* positions, float* q_latent,
                             float* q_rope) {
  kernel_entry();
  extern __shared__ float q_nope[];
  const int64_t i = blockIdx.x / p.heads, h = blockIdx.x % p.heads, half = p.rope / 2;
  const float* qh = q + i * ldq + h * (p.nope + p.rope);
  for (int64_t d = threadIdx.x; d < p.nope; d += blockDim.x) q_nope[d] = qh[d];
  __syncthreads();
  float* latent = q_latent + (i * p.heads + h) * p.lora;
  for (int64_t r = threadIdx.x; r < p.lora; r += blockDim.x) {
    const float* k = p.key + (h * p.lora + r) * p.nope;
    float s = 0;
    for (int64_t d = 0; d < p.nope; ++d) s += k[d] * q_nope[d];
    latent[r] = s;
  }
  const int32_t pos = positions[i];
  float* roped = q_rope + (i * p.heads + h) * p.rope;
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    float sn, cs;
    sincosf(float(pos) * p.inv_freq[j], &sn, &cs);
    cs *= p.rope_scale, sn *= p.rope_scale;
    const float a = qh[p.nope + j], b = qh[p.nope + j + half];
    roped[j] = a * cs - b * sn;
    roped[j + half] = b * cs + a * sn;
  }
}

// Dynamic shared memory: q_latent (lora), q_rope (rope), mix (lora), the tile's scores (kTile).
__global__ void attention_kernel(const float* q_latent, const float* q_rope, MlaParams p, const int32_t* positions,
                                 LatentKv kv, PageTables tables, float* out) {
  kernel_entry();
  extern __shared__ float smem[];
  const int64_t lora = p.lora, rope = p.rope, floats = p.latent_floats();
  float* ql = smem;
  float* qr = ql + lora;
  float* mix = qr + rope;
  float* score = mix + lora;
  const int64_t i = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t r = threadIdx.x; r < lora; r += blockDim.x) {
    ql[r] = q_latent[(i * p.heads + h) * lora + r];
    mix[r] = 0.0f;
  }
  for (int64_t j = threadIdx.x; j < rope; j += blockDim.x) qr[j] = q_rope[(i * p.heads + h) * rope + j];
  __syncthreads();
  const int32_t* table = tables.pages + int64_t(tables.seq_of_row[i]) * tables.stride;
  const int64_t len = int64_t(positions[i]) + 1;
  float best = -INFINITY, sum = 0.0f;
  for (int64_t t0 = 0; t0 < len; t0 += kTile) {
    const int64_t count = len - t0 < kTile ? len - t0 : kTile;
    for (int64_t tt = warp; tt < count; tt += warps) {
      const int64_t at = latent_row(table, t0 + tt, floats);
      float a = 0, b = 0;
      for (int64_t j = lane; j < lora; j += 32) a += ql[j] * latent_at(kv.rows, kv.codec, at + j);
      for (int64_t j = lane; j < rope; j += 32) b += qr[j] * latent_at(kv.rows, kv.codec, at + lora + j);
      a = warp_total(a);
      b = warp_total(b);
      if (lane == 0) score[tt] = (a + b) * p.softmax_scale;
    }
    __syncthreads();
    float top = best;
    for (int64_t tt = 0; tt < count; ++tt) top = fmaxf(top, score[tt]);
    const float shrink = expf(best - top);  // 0 on the first tile (best = -inf)
    __syncthreads();
    for (int64_t tt = threadIdx.x; tt < count; tt += blockDim.x) score[tt] = expf(score[tt] - top);
    __syncthreads();
    float tile_sum = 0;
    for (int64_t tt = 0; tt < count; ++tt) tile_sum += score[tt];
    sum = sum * shrink + tile_sum;
    best = top;
    for (int64_t r = threadIdx.x; r < lora; r += blockDim.x) {
      float acc = mix[r] * shrink;
      for (int64_t tt = 0; tt < count; ++tt)
        acc += score[tt] * latent_at(kv.rows, kv.codec, latent_row(table, t0 + tt, floats) + r);
      mix[r] = acc;
    }
    __syncthreads();
  }
  const float inv = 1.0f / sum;
  for (int64_t d = warp; d < p.v; d += warps) {
    const float* uv = p.value + (h * p.v + d) * lora;
    float s = 0;
    for (int64_t r = lane; r < lora; r += 32) s += uv[r] * mix[r];
    s = warp_total(s);
    if (lane == 0) out[(i * p.heads + h) * p.v + d] = s * inv;
  }
}

}  // namespace

void mla_store_latent(const float* kv_a, int64_t ld, int64_t rows, const MlaParams& p, const int32_t* positions,
                      const LatentKv& kv, const PageTables& tables, cudaStream_t stream) {
  if (rows <= 0) return;
  launch(store_latent_kernel, unsigned(rows), kThreads, 0, stream, kv_a, ld, p, positions, kv, tables);
}

void mla_query(const float* q, int64_t ldq, int64_t rows, const MlaParams& p, const int32_t* positions,
               float* q_latent, float* q_rope, cudaStream_t stream) {
  if (rows <= 0) return;
  launch(query_kernel, unsigned(rows * p.heads), kThreads, size_t(p.nope) * sizeof(float), stream, q, ldq, p,
         positions, q_latent, q_rope);
}

void mla_attention(const float* q_latent, const float* q_rope, int64_t rows, const MlaParams& p,
                   const int32_t* positions, const LatentKv& kv, const PageTables& tables, float* out,
                   cudaStream_t stream) {
  if (rows <= 0) return;
  const size_t shared = size_t(2 * p.lora + p.rope + kTile) * sizeof(float);
  launch(attention_kernel, unsigned(rows * p.heads), kThreads, shared, stream, q_latent, q_rope, p, positions, kv,
         tables, out);
}

}  // namespace tierlm::gpu::device
