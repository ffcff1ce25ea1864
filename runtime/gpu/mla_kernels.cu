// runtime/gpu/mla_kernels.cu — DeepSeek's multi-head latent attention on the device (see mla_kernels.cuh), with the
// CPU's arithmetic (runtime/engine/mla.cpp): the latent rms-normed in f32, rotate_half RoPE with the host's
// frequency table and YaRN factor, scores as (q_latent · latent + q_rope · k_rope) * scale, an online softmax
// over the row's positions, the latent mix through W_uv at the end. A block per (row, head) (or per (row, head, chunk
// of positions) in the split form, merged by a second kernel): its warps score one position each, its threads then
// fold a tile of positions into the latent mix (one latent dim each).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "runtime/gpu/device_launch.cuh"
#include "runtime/gpu/mla_kernels.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

constexpr int kThreads = 128;  // per block: 4 warps
constexpr int kTile = 128;     // positions scored per pass
constexpr int64_t kMaxSplits = 32;  // split form: chunks of positions per (row, head) at most

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

// The softmax mix of one (row, head) over positions [begin, end) of its sequence, in shared memory: `mix` (lora
// floats, unnormalized: sum_t exp(score_t - best) latent_t) and the running max and sum, returned in best / sum.
// smem: q_latent (lora), q_rope (rope), mix (lora), the tile's scores (kTile); an empty range leaves best = -inf.
__device__ void attend_range(const float* q_latent, const float* q_rope, const MlaParams& p, const LatentKv& kv,
                             const int32_t* table, int64_t begin, int64_t end, float* smem, float& best, float& sum) {
  const int64_t lora = p.lora, rope = p.rope, floats = p.latent_floats();
  float* ql = smem;
  float* qr = ql + lora;
  float* mix = qr + rope;
  float* score = mix + lora;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t r = threadIdx.x; r < lora; r += blockDim.x) {
    ql[r] = q_latent[r];
    mix[r] = 0.0f;
  }
  for (int64_t j = threadIdx.x; j < rope; j += blockDim.x) qr[j] = q_rope[j];
  __syncthreads();
  best = -INFINITY, sum = 0.0f;
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t count = end - t0 < kTile ? end - t0 : kTile;
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
}

// out (v floats) = W_uv[h] · mix / sum, a warp per output dim (mix in shared memory, complete).
__device__ void project_out(const MlaParams& p, int64_t h, const float* mix, float sum, float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const float inv = 1.0f / sum;
  for (int64_t d = warp; d < p.v; d += warps) {
    const float* uv = p.value + (h * p.v + d) * p.lora;
    float s = 0;
    for (int64_t r = lane; r < p.lora; r += 32) s += uv[r] * mix[r];
    s = warp_total(s);
    if (lane == 0) out[d] = s * inv;
  }
}

// One block per (row, head): every position of the row's sequence.
__global__ void attention_kernel(const float* q_latent, const float* q_rope, MlaParams p, const int32_t* positions,
                                 LatentKv kv, PageTables tables, float* out) {
  kernel_entry();
  extern __shared__ float smem[];
  const int64_t item = blockIdx.x, i = item / p.heads, h = item % p.heads;
  const int32_t* table = tables.pages + int64_t(tables.seq_of_row[i]) * tables.stride;
  float best, sum;
  attend_range(q_latent + item * p.lora, q_rope + item * p.rope, p, kv, table, 0, int64_t(positions[i]) + 1, smem,
               best, sum);
  project_out(p, h, smem + p.lora + p.rope, sum, out + item * p.v);
}

// Split form, first pass: block (item, c) mixes positions [c * chunk, (c + 1) * chunk) of the row's range and writes
// its unnormalized mix (lora floats) and (best, sum) to the partials; chunks past the row's last position do nothing.
__global__ void partial_kernel(const float* q_latent, const float* q_rope, MlaParams p, const int32_t* positions,
                               LatentKv kv, PageTables tables, int64_t chunk, int64_t splits, float* partial) {
  kernel_entry();
  extern __shared__ float smem[];
  const int64_t item = blockIdx.x, i = item / p.heads, c = blockIdx.y;
  const int64_t len = int64_t(positions[i]) + 1, begin = c * chunk;
  if (begin >= len) return;
  const int32_t* table = tables.pages + int64_t(tables.seq_of_row[i]) * tables.stride;
  float best, sum;
  attend_range(q_latent + item * p.lora, q_rope + item * p.rope, p, kv, table, begin, min(begin + chunk, len), smem,
               best, sum);
  float* mine = partial + (item * splits + c) * (p.lora + 2);
  const float* mix = smem + p.lora + p.rope;
  for (int64_t r = threadIdx.x; r < p.lora; r += blockDim.x) mine[r] = mix[r];
  if (threadIdx.x == 0) mine[p.lora] = best, mine[p.lora + 1] = sum;
}

// Split form, second pass: the row's chunks merged (each rescaled to the largest max), then through W_uv.
__global__ void merge_kernel(MlaParams p, const int32_t* positions, int64_t chunk, int64_t splits,
                             const float* partial, float* out) {
  kernel_entry();
  extern __shared__ float mix[];
  const int64_t item = blockIdx.x, i = item / p.heads, h = item % p.heads;
  const int64_t used = (int64_t(positions[i]) + chunk) / chunk;  // chunks holding positions [0, pos]
  const float* parts = partial + item * splits * (p.lora + 2);
  float top = -INFINITY;
  for (int64_t c = 0; c < used; ++c) top = fmaxf(top, parts[c * (p.lora + 2) + p.lora]);
  float sum = 0;
  for (int64_t c = 0; c < used; ++c) {
    const float* part = parts + c * (p.lora + 2);
    sum += part[p.lora + 1] * expf(part[p.lora] - top);
  }
  for (int64_t r = threadIdx.x; r < p.lora; r += blockDim.x) {
    float acc = 0;
    for (int64_t c = 0; c < used; ++c) {
      const float* part = parts + c * (p.lora + 2);
      acc += part[r] * expf(part[p.lora] - top);
    }
    mix[r] = acc;
  }
  __syncthreads();
  project_out(p, h, mix, sum, out + item * p.v);
}

// Positions a split block mixes: whole tiles, at most kMaxSplits chunks over max_len.
int64_t chunk_positions(int64_t max_len) {
  const int64_t per = (max_len + kMaxSplits - 1) / kMaxSplits;
  return std::max<int64_t>(kTile, (per + kTile - 1) / kTile * kTile);
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
  launch(attention_kernel, unsigned(rows * p.heads), kThreads, size_t(2 * p.lora + p.rope + kTile) * sizeof(float),
         stream, q_latent, q_rope, p, positions, kv, tables, out);
}

int64_t mla_split_scratch_floats(int64_t rows, const MlaParams& p, int64_t max_len) {
  const int64_t chunk = chunk_positions(max_len);
  return rows * p.heads * ((max_len + chunk - 1) / chunk) * (p.lora + 2);
}

void mla_attention_split(const float* q_latent, const float* q_rope, int64_t rows, const MlaParams& p,
                         const int32_t* positions, const LatentKv& kv, const PageTables& tables, int64_t max_len,
                         float* scratch, float* out, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t chunk = chunk_positions(max_len), splits = (max_len + chunk - 1) / chunk;
  launch(partial_kernel, dim3(unsigned(rows * p.heads), unsigned(splits)), kThreads,
         size_t(2 * p.lora + p.rope + kTile) * sizeof(float), stream, q_latent, q_rope, p, positions, kv, tables,
         chunk, splits, scratch);
  launch(merge_kernel, unsigned(rows * p.heads), kThreads, size_t(p.lora) * sizeof(float), stream, p, positions,
         chunk, splits, static_cast<const float*>(scratch), out);
}

}  // namespace tierlm::gpu::device
