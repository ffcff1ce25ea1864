// runtime/gpu/device_kernels.cu — the CUDA kernels of the GPU layers (see device_kernels.cuh for the contract).
// Matvec is memory-bound. Decode (one x row) of f16/bf16: a block of 8 warps per 4-8 rows, x in registers, every
// lane streaming 16-byte words of several rows at once (dense_rows_matvec; RMSNorm or the SiLU gate fused into its
// x load). Otherwise one block of 8 warps per output unit (8 dense rows, or a 16-row panel of a packed weight), the
// warps splitting the columns, each lane reading 16 bytes per step with several steps' loads issued before use.
// Partial sums are reduced in shared memory (deterministic: no atomics). Attention is split over positions
// (flash-decoding) with a small combine.
#include "runtime/gpu/device_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tierlm::gpu::device {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;

__device__ __forceinline__ float load_scale(const void* p, int type, int64_t i) {
  if (type == 0) return static_cast<const float*>(p)[i];
  if (type == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Eight consecutive dense elements as floats.
__device__ __forceinline__ void load8(const void* base, int format, int64_t i, float* out) {
  if (format == 0) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w; out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    return;
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + i);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (format == 1) {
      const __half2 h = *reinterpret_cast<const __half2*>(&words[k]);
      const float2 f = __half22float2(h);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    } else {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  }
}

__device__ __forceinline__ float load_dense(const void* base, int format, int64_t i) {
  if (format == 0) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  if (format == 1) return __half2float(__ushort_as_half(h));
  return __uint_as_float(uint32_t(h) << 16);
}

// One warp per row, 8 rows per block; each lane reads 16 bytes per step, kUnroll steps issued before use.
template <int NX>
__global__ void __launch_bounds__(kThreads) dense_matvec(MatrixRef w, const float* __restrict__ x, int64_t ldx,
                                                         float* __restrict__ y, int64_t ldy, bool accumulate) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= w.rows) return;
  const int64_t cols = w.cols;
  const size_t es = w.format == 0 ? 4 : 2;
  const void* wrow = static_cast<const char*>(w.data) + size_t(row) * size_t(cols) * es;
  float acc[NX] = {};
  if (cols % 8 == 0) {
    const int64_t steps = cols / 8;  // one step: 8 elements of one lane
    for (int64_t s0 = lane; s0 < steps; s0 += 32 * kUnroll) {
      float wv[kUnroll][8];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t s = s0 + int64_t(u) * 32;
        if (s < steps) load8(wrow, w.format, s * 8, wv[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t s = s0 + int64_t(u) * 32;
        if (s >= steps) break;
#pragma unroll
        for (int i = 0; i < NX; ++i) {
          const float4 a = *reinterpret_cast<const float4*>(x + i * ldx + s * 8);
          const float4 b = *reinterpret_cast<const float4*>(x + i * ldx + s * 8 + 4);
          acc[i] += wv[u][0] * a.x + wv[u][1] * a.y + wv[u][2] * a.z + wv[u][3] * a.w + wv[u][4] * b.x +
                    wv[u][5] * b.y + wv[u][6] * b.z + wv[u][7] * b.w;
        }
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float v = load_dense(wrow, w.format, c);
#pragma unroll
      for (int i = 0; i < NX; ++i) acc[i] += v * x[i * ldx + c];
    }
  }
#pragma unroll
  for (int i = 0; i < NX; ++i) {
    const float t = warp_sum(acc[i]);
    if (lane == 0) {
      float& out = y[i * ldy + row];
      out = accumulate ? out + t : t;
    }
  }
}

// One block per 16-row panel. A step of one lane: 16 bytes = 4 rows x 4 columns (8-bit) or 4 rows x 8 columns
// (4-bit: quad c in the low nibbles, quad c+4 in the high ones). Lanes with the same (lane % 4) share rows.
template <int NX, int BITS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) packed_matvec(MatrixRef w, const float* __restrict__ x, int64_t ldx,
                                                          float* __restrict__ y, int64_t ldy, bool accumulate) {
  __shared__ float shared[WARPS * NX * 16];  // [warp][x row][16 panel rows]
  const int64_t panel = blockIdx.x;
  const int64_t cols = w.cols, groups = cols / w.group_size;
  const uint8_t* data = static_cast<const uint8_t*>(w.data) + panel * cols * 16 * BITS / 8;
  const bool affine = w.biases != nullptr;
  const int j = threadIdx.x % 4;  // rows 4j..4j+3
  // A "unit" is 16 bytes of one lane; units are numbered so consecutive threads read consecutive bytes.
  const int64_t units = cols * 16 * BITS / 8 / 16;
  float acc[NX][4] = {};
  for (int64_t u0 = threadIdx.x; u0 < units; u0 += int64_t((WARPS * 32)) * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t unit = u0 + int64_t(u) * (WARPS * 32);
      if (unit < units) raw[u] = *reinterpret_cast<const uint4*>(data + unit * 16);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t unit = u0 + int64_t(u) * (WARPS * 32);
      if (unit >= units) break;
      const uint32_t words[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};  // word t: row 4j+t
      int64_t c_lo, c_hi = 0;
      if (BITS == 8) {
        c_lo = (unit / 4) * 4;  // quad = unit / 4
      } else {
        const int64_t block = unit / 16, chunk = (unit % 16) / 4;
        c_lo = block * 32 + chunk * 4;
        c_hi = c_lo + 16;
      }
      const int64_t g = c_lo / w.group_size;
#pragma unroll
      for (int i = 0; i < NX; ++i) {
        const float* xi = x + i * ldx;
        const float4 xl = *reinterpret_cast<const float4*>(xi + c_lo);
        float4 xh = make_float4(0, 0, 0, 0);
        if (BITS == 4) xh = *reinterpret_cast<const float4*>(xi + c_hi);
        const float xsum = xl.x + xl.y + xl.z + xl.w + (BITS == 4 ? xh.x + xh.y + xh.z + xh.w : 0.0f);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t wd = words[t];
          float dot;
          if (BITS == 8) {
            dot = float(wd & 0xff) * xl.x + float((wd >> 8) & 0xff) * xl.y + float((wd >> 16) & 0xff) * xl.z +
                  float(wd >> 24) * xl.w;
          } else {
            dot = float(wd & 0xf) * xl.x + float((wd >> 8) & 0xf) * xl.y + float((wd >> 16) & 0xf) * xl.z +
                  float((wd >> 24) & 0xf) * xl.w + float((wd >> 4) & 0xf) * xh.x + float((wd >> 12) & 0xf) * xh.y +
                  float((wd >> 20) & 0xf) * xh.z + float((wd >> 28) & 0xf) * xh.w;
          }
          const int64_t si = (panel * groups + g) * 16 + 4 * j + t;
          const float d = load_scale(w.scales, w.scale_type, si);
          const float m = affine ? load_scale(w.biases, w.scale_type, si) : -128.0f * d;
          acc[i][t] += d * dot + m * xsum;
        }
      }
    }
  }
  // Lanes l, l^4, l^8, ... hold the same rows: reduce over lane bits 2..4, then over warps.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < NX; ++i)
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      float v = acc[i][t];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (lane < 4) shared[((warp * NX + i) * 4 + lane) * 4 + t] = v;  // lane == j here
    }
  __syncthreads();
  if (threadIdx.x < NX * 16) {
    const int i = threadIdx.x / 16, r = threadIdx.x % 16;
    float total = 0;
    for (int k = 0; k < WARPS; ++k) total += shared[((k * NX + i) * 4 + r / 4) * 4 + r % 4];
    const int64_t row = panel * 16 + r;
    if (row < w.rows) {
      float& out = y[i * ldy + row];
      out = accumulate ? out + total : total;
    }
  }
}

template <int NX>
void launch_matvec(const MatrixRef& w, const float* x, int64_t ldx, float* y, int64_t ldy, bool accumulate,
                   cudaStream_t stream) {
  if (w.format <= 2) {
    dense_matvec<NX><<<unsigned((w.rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(w, x, ldx, y, ldy, accumulate);
  } else {
    // Few panels (a short, wide matrix such as down): 32 warps a block, so the SMs still have loads enough in flight.
    const unsigned panels = unsigned((w.rows + 15) / 16);
    if constexpr (NX == 1) {
      if (panels < 2 * 132) {
        if (w.bits == 8) packed_matvec<1, 8, 32><<<panels, 1024, 0, stream>>>(w, x, ldx, y, ldy, accumulate);
        else packed_matvec<1, 4, 32><<<panels, 1024, 0, stream>>>(w, x, ldx, y, ldy, accumulate);
        return;
      }
    }
    if (w.bits == 8)
      packed_matvec<NX, 8, kWarps><<<panels, kThreads, 0, stream>>>(w, x, ldx, y, ldy, accumulate);
    else
      packed_matvec<NX, 4, kWarps><<<panels, kThreads, 0, stream>>>(w, x, ldx, y, ldy, accumulate);
  }
}

__global__ void dequantize_kernel(MatrixRef w, int64_t r0, int64_t count, __half* out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count * w.cols) return;
  const int64_t r = r0 + idx / w.cols, c = idx % w.cols;
  float v;
  if (w.format <= 2) {
    v = load_dense(w.data, w.format, r * w.cols + c);
  } else {
    const int64_t panel = r / 16, lane = r % 16, groups = w.cols / w.group_size;
    const uint8_t* p = static_cast<const uint8_t*>(w.data) + panel * w.cols * 16 * w.bits / 8;
    uint32_t code;
    if (w.bits == 8) {
      code = p[(c / 4) * 64 + lane * 4 + c % 4];
    } else {
      const int64_t block = c / 32, quad = (c % 32) / 4;
      const uint8_t byte = p[block * 256 + (quad % 4) * 64 + lane * 4 + c % 4];
      code = quad >= 4 ? byte >> 4 : byte & 0xf;
    }
    const int64_t si = (panel * groups + c / w.group_size) * 16 + lane;
    const float d = load_scale(w.scales, w.scale_type, si);
    v = w.biases ? d * float(code) + load_scale(w.biases, w.scale_type, si) : d * (float(code) - 128.0f);
  }
  out[idx] = __float2half(v);
}

__global__ void to_f16_kernel(const float* x, int64_t count, __half* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2half(x[i]);
}

__device__ float block_sum(float v, float* shared /* 32 */) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = 0;
  for (int k = 0; k < warps; ++k) t += shared[k];
  return t;
}

__device__ float block_max(float v, float* shared /* 32 */) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int k = 0; k < warps; ++k) t = fmaxf(t, shared[k]);
  return t;
}

// Eight f16/bf16 elements of a 16-byte word as floats.
__device__ __forceinline__ void widen8(const uint4 raw, int format, float* out) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (format == 1) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[k]));
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    } else {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  }
}

// One x row (decode) of an f16/bf16 weight with K <= 8 * 256 * CH columns: a block of 256 threads takes R rows;
// thread t owns the 8-column chunks t, t + 256, ... of every row, so its slice of x is loaded (and transformed)
// once into registers, and a row costs it CH 16-byte streaming loads; RU rows' loads are issued before any is
// used. XMODE 0: x as is; 1: x rms-normed by norm_weight (the threads cover x exactly once, so the sum of squares
// comes free); 2: x = silu(gate) * up of a [gate | up] row of width 2K (the silu_gate kernel's formula). Partial
// sums: warp shuffles, then the 8 warps in shared memory (deterministic).
template <int CH, int R, int XMODE>
__global__ void __launch_bounds__(kThreads) dense_rows_matvec(MatrixRef w, const float* __restrict__ x,
                                                              const float* __restrict__ norm_weight, float eps,
                                                              float* __restrict__ y, bool accumulate) {
  __shared__ float shared[kWarps * R];
  __shared__ float reduce[32];
  const int64_t cols = w.cols, chunks = cols / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float xr[CH][8];
  float squares = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    const int64_t chunk = threadIdx.x + int64_t(c) * kThreads;
#pragma unroll
    for (int e = 0; e < 8; ++e) xr[c][e] = 0.0f;
    if (chunk >= chunks) continue;
    if (XMODE == 2) {
      float g[8], u[8];
      load8(x, 0, chunk * 8, g);
      load8(x, 0, cols + chunk * 8, u);
#pragma unroll
      for (int e = 0; e < 8; ++e) xr[c][e] = g[e] / (1.0f + expf(-g[e])) * u[e];
    } else {
      load8(x, 0, chunk * 8, xr[c]);
#pragma unroll
      for (int e = 0; e < 8; ++e) squares += xr[c][e] * xr[c][e];
    }
  }
  if (XMODE == 1) {
    const float inv = rsqrtf(block_sum(squares, reduce) / float(cols) + eps);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int64_t chunk = threadIdx.x + int64_t(c) * kThreads;
      if (chunk >= chunks) continue;
      float nw[8];
      load8(norm_weight, 0, chunk * 8, nw);
#pragma unroll
      for (int e = 0; e < 8; ++e) xr[c][e] = nw[e] * (xr[c][e] * inv);
    }
  }
  constexpr int RU = (8 / CH) > R ? R : ((8 / CH) < 1 ? 1 : 8 / CH);
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const uint4* base = static_cast<const uint4*>(w.data);  // a row is `chunks` words
#pragma unroll
  for (int r0 = 0; r0 < R; r0 += RU) {
    uint4 raw[RU][CH];
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      const int64_t row = min(row0 + r0 + r, w.rows - 1);  // a clamped row is read but never written
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const int64_t chunk = threadIdx.x + int64_t(c) * kThreads;
        raw[r][c] = chunk < chunks ? __ldcs(base + row * chunks + chunk) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      float acc = 0;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        float wv[8];
        widen8(raw[r][c], w.format, wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += wv[e] * xr[c][e];
      }
      acc = warp_sum(acc);
      if (lane == 0) shared[warp * R + r0 + r] = acc;
    }
  }
  __syncthreads();
  if (threadIdx.x < R && row0 + threadIdx.x < w.rows) {
    float total = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) total += shared[k * R + threadIdx.x];
    float& out = y[row0 + threadIdx.x];
    out = accumulate ? out + total : total;
  }
}

template <int CH, int XMODE>
void launch_dense_rows(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                       bool accumulate, cudaStream_t stream) {
  // 8 rows a block: x (f32) is re-read from L2 once per block, a quarter of the weight bytes; fewer rows only
  // where 8 would leave some of the 132 SMs without a block.
  if (w.rows >= 8 * 132) {
    dense_rows_matvec<CH, 8, XMODE><<<unsigned((w.rows + 7) / 8), kThreads, 0, stream>>>(w, x, norm_weight, eps, y,
                                                                                        accumulate);
  } else {
    dense_rows_matvec<CH, 4, XMODE><<<unsigned((w.rows + 3) / 4), kThreads, 0, stream>>>(w, x, norm_weight, eps, y,
                                                                                        accumulate);
  }
}

template <int XMODE>
void launch_dense_rows_any(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                           bool accumulate, cudaStream_t stream) {
  const int64_t per_thread = (w.cols / 8 + kThreads - 1) / kThreads;
  if (per_thread <= 1) launch_dense_rows<1, XMODE>(w, x, norm_weight, eps, y, accumulate, stream);
  else if (per_thread <= 2) launch_dense_rows<2, XMODE>(w, x, norm_weight, eps, y, accumulate, stream);
  else if (per_thread <= 4) launch_dense_rows<4, XMODE>(w, x, norm_weight, eps, y, accumulate, stream);
  else launch_dense_rows<8, XMODE>(w, x, norm_weight, eps, y, accumulate, stream);
}

__global__ void rms_norm_kernel(const float* x, int64_t ldx, const float* weight, int64_t cols, int64_t width,
                                float eps, float* out, int64_t ldout) {
  __shared__ float shared[32];
  const int64_t per_row = cols / width;
  const int64_t row = blockIdx.x / per_row, part = blockIdx.x % per_row;
  const float* xr = x + row * ldx + part * width;
  float* o = out + row * ldout + part * width;
  float s = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) s += xr[i] * xr[i];
  s = block_sum(s, shared);
  const float inv = rsqrtf(s / float(width) + eps);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) o[i] = weight[i] * (xr[i] * inv);
}

__global__ void bias_kernel(float* qkv, int64_t rows, int64_t stride, const float* bias) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * stride) qkv[i] += bias[i % stride];
}

// Block per (row, head slot): slots [0, heads) are q heads, [heads, heads+kv) k heads, then kv v heads.
__global__ void rope_store_kernel(float* qkv, QkvParams p, const int32_t* positions, const KvRef* caches,
                                  const int32_t* cache_of_row) {
  __shared__ float shared[32];
  const int64_t slots = p.heads + 2 * p.kv_heads;
  const int64_t row = blockIdx.x / slots, slot = blockIdx.x % slots;
  const int64_t hd = p.head_dim, half = hd / 2, stride = slots * hd;
  float* v = qkv + row * stride + slot * hd;
  const int32_t pos = positions[row];
  if (slot < p.heads + p.kv_heads) {
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      float s, c;
      sincosf(float(pos) * p.inv_freq[j], &s, &c);
      const float a = v[j], b = v[j + half];
      v[j] = a * c - b * s;
      v[j + half] = b * c + a * s;
    }
    __syncthreads();
    if (slot < p.heads) return;
  }
  const bool is_key = slot < p.heads + p.kv_heads;
  const int64_t kvh = is_key ? slot - p.heads : slot - p.heads - p.kv_heads;
  const KvRef& kv = caches[cache_of_row[row]];
  const int64_t at = int64_t(pos) * p.kv_heads + kvh;
  if (kv.codec == 0) {
    __half* dst = static_cast<__half*>(is_key ? kv.keys : kv.values) + at * hd;
    for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) dst[j] = __float2half(v[j]);
  } else {
    // One thread per block of dims finds its scale; then every dim is coded with its block's scale.
    const int block = q8_block(hd), nb = int(hd / block);
    float* scales = (is_key ? kv.key_scales : kv.value_scales) + at * nb;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
      float amax = 0;
      for (int j = 0; j < block; ++j) amax = fmaxf(amax, fabsf(v[b * block + j]));
      shared[b] = __half2float(__float2half_rn(amax / 127.0f));
    }
    __syncthreads();
    int8_t* dst = static_cast<int8_t*>(is_key ? kv.keys : kv.values) + at * hd;
    for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
      const float scale = shared[j / block], inv = scale > 0 ? 1.0f / scale : 0.0f;
      dst[j] = int8_t(fminf(fmaxf(roundf(v[j] * inv), -127.0f), 127.0f));
    }
    for (int b = threadIdx.x; b < nb; b += blockDim.x) scales[b] = shared[b];
  }
}

// Eight K/V elements of position `at` starting at dim j (j a multiple of 8), as floats.
__device__ __forceinline__ void kv_load8(const KvRef& kv, bool key, int64_t at, int64_t hd, int64_t j, float* out) {
  if (kv.codec == 0) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const __half*>(key ? kv.keys : kv.values) + at * hd + j);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h[k]);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
    return;
  }
  const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(key ? kv.keys : kv.values) + at * hd + j);
  const int8_t* c = reinterpret_cast<const int8_t*>(&raw);
  const int block = q8_block(hd);
  const float scale = (key ? kv.key_scales : kv.value_scales)[at * (hd / block) + j / block];
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = float(c[k]) * scale;
}

__device__ __forceinline__ float kv_load(const KvRef& kv, bool key, int64_t at, int64_t hd, int64_t j) {
  if (kv.codec == 0) return __half2float(static_cast<const __half*>(key ? kv.keys : kv.values)[at * hd + j]);
  const int8_t q = static_cast<const int8_t*>(key ? kv.keys : kv.values)[at * hd + j];
  const int block = q8_block(hd);
  return float(q) * (key ? kv.key_scales : kv.value_scales)[at * (hd / block) + j / block];
}

constexpr int kMaxHeadDim = 256;

constexpr int kSplitThreads = 128;
constexpr int kSplitWarps = kSplitThreads / 32;

// Positions per block of the split attention: 64, more only where max_len would need over 256 blocks per head.
int64_t attention_chunk(int64_t max_len) {
  int64_t chunk = 64;
  while ((max_len + chunk - 1) / chunk > 256) chunk *= 2;
  return chunk;
}

// Flash-decoding: block per (row, q head, chunk of positions). Scores: one thread per position (its key row read
// whole, 16 bytes at a time, against q in shared memory); the chunk's max and exp-sum; values: warp w takes
// positions w, w+4, ..., lane l dims l, l+32, ...; the unnormalized sums, the max and the exp-sum go to `partial`
// [row][head][chunk][hd + 2]. A grid sized from max_len keeps the launch the same across steps (CUDA graphs);
// chunks past the row's length return at once.
__global__ void __launch_bounds__(kSplitThreads) attention_split_kernel(const float* qkv, QkvParams p,
                                                                       const int32_t* positions, const KvRef* caches,
                                                                       const int32_t* cache_of_row, int64_t chunk,
                                                                       int64_t chunks, float* partial) {
  __shared__ float shared[32];
  extern __shared__ float dynamic[];  // q[hd], scores[chunk], sums[warps][hd]
  const int64_t hd = p.head_dim;
  float* q = dynamic;
  float* sc = dynamic + hd;
  float* sums = sc + chunk;
  const int64_t head_row = blockIdx.x / chunks, part = blockIdx.x % chunks;
  const int64_t row = head_row / p.heads, h = head_row % p.heads;
  const int64_t len = int64_t(positions[row]) + 1;
  const int64_t t0 = part * chunk, t1 = min(len, t0 + chunk);
  if (t0 >= len) return;
  const int64_t group = p.heads / p.kv_heads, kvh = h / group;
  const int64_t stride = (p.heads + 2 * p.kv_heads) * hd;
  const KvRef kv = caches[cache_of_row[row]];
  const float scale = rsqrtf(float(hd));
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) q[j] = qkv[row * stride + h * hd + j] * scale;
  __syncthreads();
  float local_max = -INFINITY;
  for (int64_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    const int64_t at = t * p.kv_heads + kvh;
    float s = 0;
#pragma unroll 4
    for (int64_t j = 0; j < hd; j += 8) {  // several 16-byte loads of the key row in flight
      float k[8];
      kv_load8(kv, true, at, hd, j, k);
#pragma unroll
      for (int e = 0; e < 8; ++e) s += q[j + e] * k[e];
    }
    sc[t - t0] = s;
    local_max = fmaxf(local_max, s);
  }
  const float mx = block_max(local_max, shared);
  float sum = 0;
  for (int64_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
    const float e = __expf(sc[t - t0] - mx);
    sc[t - t0] = e;
    sum += e;
  }
  sum = block_sum(sum, shared);
  __syncthreads();  // every score written before any thread reads another's
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kDims = kMaxHeadDim / 32;
  float acc[kDims] = {};
#pragma unroll 4
  for (int64_t t = t0 + warp; t < t1; t += kSplitWarps) {
    const float wt = sc[t - t0];
    const int64_t at = t * p.kv_heads + kvh;
#pragma unroll
    for (int d = 0; d < kDims; ++d) {
      const int64_t j = lane + 32 * d;
      if (j < hd) acc[d] += wt * kv_load(kv, false, at, hd, j);
    }
  }
#pragma unroll
  for (int d = 0; d < kDims; ++d) {
    const int64_t j = lane + 32 * d;
    if (j < hd) sums[warp * hd + j] = acc[d];
  }
  __syncthreads();
  float* out = partial + blockIdx.x * (hd + 2);
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    float total = 0;
    for (int k = 0; k < kSplitWarps; ++k) total += sums[k * hd + j];
    out[j] = total;
  }
  if (threadIdx.x == 0) {
    out[hd] = mx;
    out[hd + 1] = sum;
  }
}

// Block per (row, q head): out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c over the row's live chunks.
__global__ void attention_combine_kernel(QkvParams p, const int32_t* positions, int64_t chunk, int64_t chunks,
                                         const float* partial, float* out) {
  const int64_t head_row = blockIdx.x, row = head_row / p.heads, hd = p.head_dim;
  const int64_t live = (int64_t(positions[row]) + 1 + chunk - 1) / chunk;
  const float* base = partial + head_row * chunks * (hd + 2);
  float m = -INFINITY;
  for (int64_t c = 0; c < live; ++c) m = fmaxf(m, base[c * (hd + 2) + hd]);
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    float num = 0, den = 0;
    for (int64_t c = 0; c < live; ++c) {
      const float* part = base + c * (hd + 2);
      const float f = __expf(part[hd] - m);
      num += f * part[j];
      den += f * part[hd + 1];
    }
    out[head_row * hd + j] = num / den;
  }
}

__global__ void silu_gate_kernel(const float* gu, int64_t rows, int64_t inter, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, j = i % inter;
  const float g = gu[r * 2 * inter + j];
  out[i] = g / (1.0f + expf(-g)) * gu[r * 2 * inter + inter + j];
}

__global__ void add_kernel(float* y, const float* x, int64_t count) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] += x[i];
}

__global__ void gather_kernel(const float* src, const int32_t* index, int64_t rows, int64_t width, float* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  dst[i] = src[int64_t(index[i / width]) * width + i % width];
}

// Rows of one expert are distinct, so no two threads of a launch touch the same element.
__global__ void scatter_add_kernel(const float* src, const int32_t* index, const float* weight, int64_t rows,
                                   int64_t width, float* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t r = i / width;
  dst[int64_t(index[r]) * width + i % width] += weight[r] * src[i];
}

__global__ void sigmoid_gate_add_kernel(const float* x, const float* gate, const float* y, int64_t width,
                                        float* hidden) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  float z = 0;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) z += gate[j] * x[row * width + j];
  z = block_sum(z, shared);
  const float g = 1.0f / (1.0f + expf(-z));
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) hidden[row * width + j] += g * y[row * width + j];
}

unsigned blocks_for(int64_t count, int threads = 256) { return unsigned((count + threads - 1) / threads); }

}  // namespace

bool dense_fusable(const MatrixRef& w) {
  return (w.format == 1 || w.format == 2) && w.cols % 8 == 0 && w.cols <= 8 * kThreads * 8;
}

void matvec_normed(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                   bool accumulate, cudaStream_t stream) {
  launch_dense_rows_any<1>(w, x, norm_weight, eps, y, accumulate, stream);
}

void matvec_gated(const MatrixRef& w, const float* gate_up, float* y, bool accumulate, cudaStream_t stream) {
  launch_dense_rows_any<2>(w, gate_up, nullptr, 0.0f, y, accumulate, stream);
}

void matvec(const MatrixRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
            cudaStream_t stream) {
  if (n == 1 && dense_fusable(w)) {
    launch_dense_rows_any<0>(w, x, nullptr, 0.0f, y, accumulate, stream);
    return;
  }
  switch (n) {
    case 1: launch_matvec<1>(w, x, ldx, y, ldy, accumulate, stream); break;
    case 2: launch_matvec<2>(w, x, ldx, y, ldy, accumulate, stream); break;
    case 3: launch_matvec<3>(w, x, ldx, y, ldy, accumulate, stream); break;
    default: launch_matvec<4>(w, x, ldx, y, ldy, accumulate, stream); break;
  }
}

void dequantize_f16(const MatrixRef& w, int64_t r0, int64_t count, void* out, cudaStream_t stream) {
  const int64_t total = count * w.cols;
  if (total > 0) dequantize_kernel<<<blocks_for(total), 256, 0, stream>>>(w, r0, count, static_cast<__half*>(out));
}

void to_f16(const float* x, int64_t count, void* out, cudaStream_t stream) {
  if (count > 0) to_f16_kernel<<<blocks_for(count), 256, 0, stream>>>(x, count, static_cast<__half*>(out));
}

void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t cols, int64_t width, float eps,
              float* out, int64_t ldout, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / width);
  if (blocks > 0) rms_norm_kernel<<<unsigned(blocks), 256, 0, stream>>>(x, ldx, weight, cols, width, eps, out, ldout);
}

void qkv_rope_store(float* qkv, int64_t rows, const QkvParams& p, const int32_t* positions, const KvRef* caches,
                    const int32_t* cache_of_row, cudaStream_t stream) {
  const int64_t stride = (p.heads + 2 * p.kv_heads) * p.head_dim;
  if (p.bias) bias_kernel<<<blocks_for(rows * stride), 256, 0, stream>>>(qkv, rows, stride, p.bias);
  if (p.q_norm) {
    rms_norm(qkv, stride, p.q_norm, rows, p.heads * p.head_dim, p.qn, p.eps, qkv, stride, stream);
    rms_norm(qkv + p.heads * p.head_dim, stride, p.k_norm, rows, p.kv_heads * p.head_dim, p.kn, p.eps,
             qkv + p.heads * p.head_dim, stride, stream);
  }
  const int64_t blocks = rows * (p.heads + 2 * p.kv_heads);
  rope_store_kernel<<<unsigned(blocks), 128, 0, stream>>>(qkv, p, positions, caches, cache_of_row);
}

int64_t attention_scratch_floats(int64_t rows, const QkvParams& p, int64_t max_len) {
  const int64_t chunk = attention_chunk(max_len);
  return rows * p.heads * ((max_len + chunk - 1) / chunk) * (p.head_dim + 2);
}

void attention(const float* qkv, int64_t rows, const QkvParams& p, const int32_t* positions, const KvRef* caches,
               const int32_t* cache_of_row, int64_t max_len, float* partial, float* out, cudaStream_t stream) {
  const int64_t chunk = attention_chunk(max_len), chunks = (max_len + chunk - 1) / chunk;
  const size_t shared = size_t(p.head_dim * (1 + kSplitWarps) + chunk) * sizeof(float);
  attention_split_kernel<<<unsigned(rows * p.heads * chunks), kSplitThreads, shared, stream>>>(
      qkv, p, positions, caches, cache_of_row, chunk, chunks, partial);
  attention_combine_kernel<<<unsigned(rows * p.heads), 64, 0, stream>>>(p, positions, chunk, chunks, partial, out);
}

void silu_gate(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream) {
  silu_gate_kernel<<<blocks_for(rows * intermediate), 256, 0, stream>>>(gate_up, rows, intermediate, out);
}

void add(float* y, const float* x, int64_t count, cudaStream_t stream) {
  add_kernel<<<blocks_for(count), 256, 0, stream>>>(y, x, count);
}

void gather_rows(const float* src, const int32_t* index, int64_t rows, int64_t width, float* dst, cudaStream_t stream) {
  gather_kernel<<<blocks_for(rows * width), 256, 0, stream>>>(src, index, rows, width, dst);
}

void scatter_add_rows(const float* src, const int32_t* index, const float* weight, int64_t rows, int64_t width,
                      float* dst, cudaStream_t stream) {
  scatter_add_kernel<<<blocks_for(rows * width), 256, 0, stream>>>(src, index, weight, rows, width, dst);
}

void sigmoid_gate_add(const float* x, const float* gate, const float* y, int64_t rows, int64_t width, float* hidden,
                      cudaStream_t stream) {
  sigmoid_gate_add_kernel<<<unsigned(rows), 256, 0, stream>>>(x, gate, y, width, hidden);
}

}  // namespace tierlm::gpu::device
