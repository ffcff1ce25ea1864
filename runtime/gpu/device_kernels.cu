// runtime/gpu/device_kernels.cu — the CUDA kernels of the GPU layers (see device_kernels.cuh for the contract).
// Matvec is memory-bound. Decode (one x row) of f16/bf16: a block of 8 warps per 4-8 rows, x in registers, every
// lane streaming 16-byte words of several rows at once (dense_rows_matvec; RMSNorm or the SiLU gate fused into its
// x load). Otherwise one block of 8 warps per output unit (8 dense rows, or a 16-row panel of a packed weight), the
// warps splitting the columns, each lane reading 16 bytes per step with several steps' loads issued before use.
// Partial sums are reduced in shared memory (deterministic: no atomics). Attention is split over positions
// (flash-decoding), reading K/V through the sequences' page tables; the last block of each (row, KV head) to finish
// merges the chunks.
// Every kernel is launched with programmatic dependent launch (see device_kernels.cuh): it lets the next kernel
// start (griddepcontrol.launch_dependents), issues what depends on nothing earlier (its weights: the first loads
// into registers, the rest of its rows as L2 prefetches), then waits (griddepcontrol.wait) before touching
// activations. Every block of every kernel waits before it returns, so "kernel N finished" still implies "all
// kernels before N finished".
#include "runtime/gpu/device_kernels.cuh"
#include "runtime/gpu/device_launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <unordered_map>
#include <utility>

namespace tierlm::gpu::device {

using namespace detail;

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;

int g_attention_debug = 0;  // diagnostics only (probe_attention): phases to skip
// Decode attention stages the chunk's K/V in shared memory before the wait; TIERLM_GPU_ATTENTION_STAGE=0 turns it off
// (A/B runs).
bool g_attention_stage = [] {
  const char* v = std::getenv("TIERLM_GPU_ATTENTION_STAGE");
  return !(v && v[0] == '0' && v[1] == 0);
}();
int g_dense_rows = 0;  // rows per block of the decode matvec: 0 auto, 4 or 8; -1: never (diagnostics)

// Bulk prefetch of [p, p + bytes) into L2 by the block's threads, 4 KiB a request (p 16-byte aligned).
__device__ __forceinline__ void prefetch_l2(const void* p, uint64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((reinterpret_cast<uintptr_t>(p) & 15) != 0) return;
  bytes &= ~uint64_t(15);
  constexpr uint64_t kPiece = 4096;
  for (uint64_t at = uint64_t(threadIdx.x) * kPiece; at < bytes; at += uint64_t(blockDim.x) * kPiece) {
    const uint32_t n = uint32_t(bytes - at < kPiece ? bytes - at : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(p) + at), "r"(n)
                 : "memory");
  }
#endif
}

__device__ __forceinline__ float load_scale(const void* p, int type, int64_t i) {
  if (type == 0) return static_cast<const float*>(p)[i];
  if (type == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// Scales i..i+3 (i a multiple of 4) as floats.
__device__ __forceinline__ void load_scales4(const void* p, int type, int64_t i, float* out) {
  if (type == 0) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    return;
  }
  const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
  const uint32_t words[2] = {v.x, v.y};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (type == 1) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[k]));
      out[2 * k] = f.x, out[2 * k + 1] = f.y;
    } else {
      out[2 * k] = __uint_as_float(words[k] << 16), out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
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
__global__ void __launch_bounds__(kThreads) dense_matvec(MatrixRef w, const float* x, int64_t ldx,
                                                         float* y, int64_t ldy, bool accumulate) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t cols = w.cols;
  const size_t es = w.format == 0 ? 4 : 2;
  let_next_kernel_start();
  {
    const int64_t first = int64_t(blockIdx.x) * kWarps, count = min(int64_t(kWarps), w.rows - first);
    prefetch_l2(static_cast<const char*>(w.data) + size_t(first) * size_t(cols) * es, uint64_t(count) * cols * es);
  }
  wait_for_previous_kernel();
  if (row >= w.rows) return;
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

// Byte K of `word` as a float, exactly: the byte goes into the mantissa of 2^23 (one byte permute) and 2^23 is
// subtracted (one add). Integer-to-float conversions run at a fraction of the FMA rate and bounded the packed
// decode matvec (q8_0 at ~50% of the memory roofline on the H100 with plain conversions).
template <int K>
__device__ __forceinline__ float byte_as_float(uint32_t word) {
  return __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7540u | K)) - 8388608.0f;
}

// One block per 16-row panel. A step of one lane: 16 bytes = 4 rows x 4 columns (8-bit) or 4 rows x 8 columns
// (4-bit: quad c in the low nibbles, quad c+4 in the high ones). Lanes with the same (lane % 4) share rows.
// XMODE (one x row only): 0 x as is; 1 x rms-normed by norm_weight (normalized as it is read); 2 x = silu(gate) *
// up of a [gate | up] row of 2 cols floats (staged once per block in cols floats of dynamic shared memory). The norm
// and gate kernels, and a round trip of the activations through memory, go away.
// The body, for one panel; EXPERT: called after the wait by expert_matvec (whose weights' address depends on the
// previous kernels), the outputs scaled by out_scale.
template <int NX, int BITS, int WARPS, int XMODE, bool EXPERT>
__device__ __forceinline__ void packed_matvec_body(const MatrixRef& w, int64_t panel, const float* x, int64_t ldx,
                                                   const float* norm_weight, float eps, float* y, int64_t ldy,
                                                   bool accumulate, float out_scale) {
  static_assert(XMODE == 0 || NX == 1, "the fused x transforms take one x row");
  extern __shared__ float staged_x[];        // XMODE 2: the gated x row
  __shared__ float shared[WARPS * NX * 16];  // [warp][x row][16 panel rows]
  const int64_t cols = w.cols, groups = cols / w.group_size;
  const uint8_t* data = static_cast<const uint8_t*>(w.data) + panel * cols * 16 * BITS / 8;
  const bool affine = w.biases != nullptr;
  const int j = threadIdx.x % 4;  // rows 4j..4j+3
  // A "unit" is 16 bytes of one lane; units are numbered so consecutive threads read consecutive bytes.
  const int64_t units = cols * 16 * BITS / 8 / 16;
  constexpr int64_t kStep = int64_t(WARPS * 32) * kUnroll;  // units per loop step of the block
  float acc[NX][4] = {};
  // A unit's group: a shift for the power-of-two group sizes every format has, a division otherwise. (It was a
  // 64-bit division per unit, a long emulated sequence; without it the 4-bit chains ran 5-8% faster than the
  // previous session's on the larger shapes, H200: 16384 x 2048 normed 21.0 -> 19.4 us, head 132 -> 123 us.)
  const int group_shift = (w.group_size & (w.group_size - 1)) == 0 ? __ffs(w.group_size) - 1 : -1;
  // Software-pipelined: the next step's kUnroll 16-byte words are loaded before this step's are used. The first
  // step's words and an L2 prefetch of the rest of the panel (and its scales) are issued before the wait.
  uint4 raw[kUnroll];
  auto load = [&](int64_t u0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t unit = u0 + int64_t(u) * (WARPS * 32);
      if (unit < units) raw[u] = __ldcs(reinterpret_cast<const uint4*>(data + unit * 16));
    }
  };
  if constexpr (!EXPERT) let_next_kernel_start();
  load(threadIdx.x);
  if (units > kStep) prefetch_l2(data + kStep * 16, uint64_t(units - kStep) * 16);
  {
    const uint64_t ss = w.scale_type == 0 ? 4 : 2, bytes = uint64_t(groups) * 16 * ss;
    prefetch_l2(static_cast<const char*>(w.scales) + uint64_t(panel) * bytes, bytes);
    if (affine) prefetch_l2(static_cast<const char*>(w.biases) + uint64_t(panel) * bytes, bytes);
  }
  if (XMODE == 1) prefetch_l2(norm_weight, uint64_t(cols) * 4);
  if constexpr (!EXPERT) wait_for_previous_kernel();
  // XMODE 1: y = W (nw * x) * inv_rms(x), and inv_rms is a scalar, so the loop multiplies by nw * x and sums the
  // squares of x on the side (the lanes with j == 0 see every column exactly once); the scale is applied to the
  // block's totals at the end. No pass over x before the loop: a prologue that computed the norm first (in shared
  // memory, or per warp) cost 3 us of a 6.6 us 3072 x 2048 q8_0 matvec (H100).
  float squares = 0;
  if constexpr (XMODE == 2) {
    // The gated row once per block into shared memory (each of its values is read by 4 lanes).
    const int64_t quads = cols / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* staged4 = reinterpret_cast<float4*>(staged_x);
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const float4 g = x4[q], u = x4[quads + q];  // as dense_rows_matvec: the fast exp and divide
      staged4[q] = make_float4(__fdividef(g.x, 1.0f + __expf(-g.x)) * u.x, __fdividef(g.y, 1.0f + __expf(-g.y)) * u.y,
                               __fdividef(g.z, 1.0f + __expf(-g.z)) * u.z, __fdividef(g.w, 1.0f + __expf(-g.w)) * u.w);
    }
    __syncthreads();
  }
  for (int64_t u0 = threadIdx.x; u0 < units; u0 += kStep) {
    uint4 cur[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = raw[u];
    if (u0 + kStep < units) load(u0 + kStep);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t unit = u0 + int64_t(u) * (WARPS * 32);
      if (unit >= units) break;
      const uint32_t words[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};  // word t: row 4j+t
      int64_t c_lo, c_hi = 0;
      if (BITS == 8) {
        c_lo = (unit / 4) * 4;  // quad = unit / 4
      } else {
        const int64_t block = unit / 16, chunk = (unit % 16) / 4;
        c_lo = block * 32 + chunk * 4;
        c_hi = c_lo + 16;
      }
      const int64_t g = group_shift >= 0 ? c_lo >> group_shift : c_lo / w.group_size;
      // The 4 rows' scales (and biases) of this group: one 8- or 16-byte load each, shared by every x row.
      float d[4], m[4];
      load_scales4(w.scales, w.scale_type, (panel * groups + g) * 16 + 4 * j, d);
      if (affine) {
        load_scales4(w.biases, w.scale_type, (panel * groups + g) * 16 + 4 * j, m);
      } else {
#pragma unroll
        for (int t = 0; t < 4; ++t) m[t] = -128.0f * d[t];
      }
#pragma unroll
      for (int i = 0; i < NX; ++i) {
        const float* xi = XMODE == 2 ? staged_x : x + i * ldx;
        float4 xl = *reinterpret_cast<const float4*>(xi + c_lo);
        float4 xh = make_float4(0, 0, 0, 0);
        if (BITS == 4) xh = *reinterpret_cast<const float4*>(xi + c_hi);
        if (XMODE == 1) {
          if (j == 0) {
            squares += xl.x * xl.x + xl.y * xl.y + xl.z * xl.z + xl.w * xl.w;
            if (BITS == 4) squares += xh.x * xh.x + xh.y * xh.y + xh.z * xh.z + xh.w * xh.w;
          }
          const float4 nl = *reinterpret_cast<const float4*>(norm_weight + c_lo);
          xl = make_float4(nl.x * xl.x, nl.y * xl.y, nl.z * xl.z, nl.w * xl.w);
          if (BITS == 4) {
            const float4 nh = *reinterpret_cast<const float4*>(norm_weight + c_hi);
            xh = make_float4(nh.x * xh.x, nh.y * xh.y, nh.z * xh.z, nh.w * xh.w);
          }
        }
        const float xsum = xl.x + xl.y + xl.z + xl.w + (BITS == 4 ? xh.x + xh.y + xh.z + xh.w : 0.0f);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t wd = words[t];
          float dot;
          if (BITS == 8) {
            dot = byte_as_float<0>(wd) * xl.x + byte_as_float<1>(wd) * xl.y + byte_as_float<2>(wd) * xl.z +
                  byte_as_float<3>(wd) * xl.w;
          } else {
            const uint32_t lo = wd & 0x0f0f0f0fu, hi = (wd >> 4) & 0x0f0f0f0fu;
            dot = byte_as_float<0>(lo) * xl.x + byte_as_float<1>(lo) * xl.y + byte_as_float<2>(lo) * xl.z +
                  byte_as_float<3>(lo) * xl.w + byte_as_float<0>(hi) * xh.x + byte_as_float<1>(hi) * xh.y +
                  byte_as_float<2>(hi) * xh.z + byte_as_float<3>(hi) * xh.w;
          }
          acc[i][t] += d[t] * dot + m[t] * xsum;
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
  __shared__ float warp_squares[XMODE == 1 ? WARPS : 1];
  if (XMODE == 1) {
    const float sq = warp_sum(squares);
    if (lane == 0) warp_squares[warp] = sq;
  }
  __syncthreads();
  if (threadIdx.x < NX * 16) {
    const int i = threadIdx.x / 16, r = threadIdx.x % 16;
    float total = 0;
    for (int k = 0; k < WARPS; ++k) total += shared[((k * NX + i) * 4 + r / 4) * 4 + r % 4];
    if (XMODE == 1) {
      float sum = 0;
      for (int k = 0; k < WARPS; ++k) sum += warp_squares[k];
      total *= rsqrtf(sum / float(cols) + eps);
    }
    if (EXPERT) total *= out_scale;
    const int64_t row = panel * 16 + r;
    if (row < w.rows) {
      float& out = y[i * ldy + row];
      out = accumulate ? out + total : total;
    }
  }
}

template <int NX, int BITS, int WARPS, int XMODE = 0>
__global__ void __launch_bounds__(WARPS * 32) packed_matvec(MatrixRef w, const float* x, int64_t ldx,
                                                          const float* norm_weight, float eps, float* y,
                                                          int64_t ldy, bool accumulate) {
  packed_matvec_body<NX, BITS, WARPS, XMODE, false>(w, blockIdx.x, x, ldx, norm_weight, eps, y, ldy, accumulate,
                                                    1.0f);
}

// Rows through their routed experts of a MoE layer in VRAM (the device routing of decode): block b
// takes panel b % panels of slot s = b / panels, the expert ids[s], whose block is blocks[ids[s]] (the matrix at
// e.data / e.scales / e.biases bytes into it). Slot s reads x + (s / x_group) * x_stride (gate_up: the slots of a
// row share its x; down: each slot its own gate_up output) and writes y + s * y_stride, scaled by weights[s] when
// weights is given. The ids come from the previous kernel, so it waits before any load.
template <int BITS, int WARPS, int XMODE>
__global__ void __launch_bounds__(WARPS * 32) expert_matvec(ExpertMatrixRef e, const void* const* blocks,
                                                          const int32_t* ids, int64_t panels, const float* x,
                                                          int64_t x_group, int64_t x_stride, const float* weights,
                                                          float* y, int64_t y_stride) {
  kernel_entry();
  const int64_t slot = blockIdx.x / panels, panel = blockIdx.x % panels;
  const char* base = static_cast<const char*>(blocks[ids[slot]]);
  if (!base) {  // not in VRAM (hybrid placement: the CPU runs it): its down output is zero, its gate_up unread
    if (XMODE == 2 && threadIdx.x < 16 && panel * 16 + threadIdx.x < e.shape.rows)
      y[slot * y_stride + panel * 16 + threadIdx.x] = 0.0f;
    return;
  }
  MatrixRef w = e.shape;
  w.data = base + e.data;
  w.scales = base + e.scales;
  w.biases = e.has_biases ? base + e.biases : nullptr;
  packed_matvec_body<1, BITS, WARPS, XMODE, true>(w, panel, x + (slot / x_group) * x_stride, 0, nullptr, 0.0f,
                                                  y + slot * y_stride, 0, false, weights ? weights[slot] : 1.0f);
}

// Routing of one row per block (one warp): softmax over the router's E logits, the k largest (first index on ties),
// renormalized when asked: the host's arithmetic (GpuLayers::top_k, engine::softmax: float exps, a double sum).
// Up to kRouteMaxPerLane * 32 experts.
constexpr int kRouteMaxPerLane = 16;
__global__ void route_topk_kernel(const float* logits, int E, int k, bool renormalize, int32_t* ids, float* weights) {
  kernel_entry();
  const int lane = threadIdx.x;
  logits += int64_t(blockIdx.x) * E;
  ids += int64_t(blockIdx.x) * k;
  weights += int64_t(blockIdx.x) * k;
  float p[kRouteMaxPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int t = 0; t < kRouteMaxPerLane; ++t) {
    const int i = lane + 32 * t;
    p[t] = i < E ? logits[i] : -INFINITY;
    mx = fmaxf(mx, p[t]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0;
#pragma unroll
  for (int t = 0; t < kRouteMaxPerLane; ++t) {
    const int i = lane + 32 * t;
    p[t] = i < E ? expf(p[t] - mx) : 0.0f;
    sum += p[t];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = float(1.0 / sum);
#pragma unroll
  for (int t = 0; t < kRouteMaxPerLane; ++t) p[t] *= inv;
  float chosen_sum = 0;
  float chosen[32];
  int32_t chosen_id[32];
  for (int j = 0; j < k; ++j) {
    float best = -1.0f;
    int32_t at = 0x7fffffff;
#pragma unroll
    for (int t = 0; t < kRouteMaxPerLane; ++t) {
      const int i = lane + 32 * t;
      if (i < E && p[t] >= 0.0f && (p[t] > best || (p[t] == best && i < at))) best = p[t], at = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t i = __shfl_xor_sync(0xffffffffu, at, o);
      if (v > best || (v == best && i < at)) best = v, at = i;
    }
#pragma unroll
    for (int t = 0; t < kRouteMaxPerLane; ++t)
      if (lane + 32 * t == at) p[t] = -1.0f;  // taken
    chosen[j] = best;
    chosen_id[j] = at;
    chosen_sum += best;
  }
  if (lane == 0)
    for (int j = 0; j < k; ++j) {
      ids[j] = chosen_id[j];
      weights[j] = renormalize && chosen_sum > 0 ? chosen[j] / chosen_sum : chosen[j];
    }
}

// h[r * width + c] += sum over the row's slots s of y[(r * k + s) * width + c] (the weighted expert outputs, in
// slot order: deterministic), for rows * width elements.
__global__ void moe_combine_kernel(const float* y, int k, int64_t rows, int64_t width, float* h) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t r = i / width, c = i % width;
  float sum = 0;
  for (int s = 0; s < k; ++s) sum += y[(r * k + s) * width + c];
  h[i] += sum;
}

// The packed matvec's launch: few panels (a short, wide matrix such as down) get 32 warps a block, so the SMs still
// have loads enough in flight. (8 words in flight a lane instead of kUnroll = 4 was slower on every llama-1B shape:
// H100, 3072 x 2048 q8_0 6.6 -> 11.8 us.)
template <int NX, int XMODE = 0>
void launch_packed(const MatrixRef& w, const float* x, int64_t ldx, const float* norm_weight, float eps, float* y,
                   int64_t ldy, bool accumulate, size_t shared, cudaStream_t stream) {
  const unsigned panels = unsigned((w.rows + 15) / 16);
  if constexpr (NX == 1) {
    if (panels < 2 * 132) {
      auto kernel = w.bits == 8 ? packed_matvec<1, 8, 32, XMODE> : packed_matvec<1, 4, 32, XMODE>;
      launch(kernel, panels, 1024, shared, stream, w, x, ldx, norm_weight, eps, y, ldy, accumulate);
      return;
    }
  }
  auto kernel = w.bits == 8 ? packed_matvec<NX, 8, kWarps, XMODE> : packed_matvec<NX, 4, kWarps, XMODE>;
  launch(kernel, panels, kThreads, shared, stream, w, x, ldx, norm_weight, eps, y, ldy, accumulate);
}

template <int NX>
void launch_matvec(const MatrixRef& w, const float* x, int64_t ldx, float* y, int64_t ldy, bool accumulate,
                   cudaStream_t stream) {
  if (w.format <= 2)
    launch(dense_matvec<NX>, unsigned((w.rows + kWarps - 1) / kWarps), kThreads, 0, stream, w, x, ldx, y, ldy, accumulate);
  else
    launch_packed<NX>(w, x, ldx, nullptr, 0.0f, y, ldy, accumulate, 0, stream);
}

// Largest packed row the fused decode kernels stage in shared memory (floats; the H100 allows 227 KiB a block).
constexpr int64_t kMaxStagedCols = 40960;

// One x row of a packed weight with the x transform fused (XMODE 1 or 2; see packed_matvec).
template <int XMODE>
void launch_packed_fused(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                         bool accumulate, cudaStream_t stream) {
  const size_t shared = XMODE == 2 ? size_t(w.cols) * 4 : 0;
  launch_packed<1, XMODE>(w, x, 0, norm_weight, eps, y, 0, accumulate, shared, stream);
}

// Element (r, c) of a weight in its host layout, as f32.
__device__ __forceinline__ float weight_element(const MatrixRef& w, int64_t r, int64_t c) {
  if (w.format <= 2) return load_dense(w.data, w.format, r * w.cols + c);
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
  return w.biases ? d * float(code) + load_scale(w.biases, w.scale_type, si) : d * (float(code) - 128.0f);
}

__global__ void embed_kernel(MatrixRef w, const int32_t* tokens, int64_t rows, float* out) {
  kernel_entry();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * w.cols) return;
  out[idx] = weight_element(w, tokens[idx / w.cols], idx % w.cols);
}

// Greedy argmax of logit rows: kArgmaxBlocks blocks per row each reduce a slice to (value, index); the last block
// of a row to finish reduces the slices. NaN is skipped; the first index wins ties (as engine::argmax).
constexpr int kArgmaxBlocks = 32, kArgmaxThreads = 256;
constexpr int32_t kNoIndex = 0x7fffffff;

__device__ __forceinline__ void argmax_take(float& best, int32_t& at, float v, int32_t i) {
  if (v > best || (v == best && i < at)) best = v, at = i;
}

// Block-wide (value, index) reduction; the result is valid in thread 0.
__device__ void block_argmax(float& best, int32_t& at) {
  __shared__ float values[32];
  __shared__ int32_t indices[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, at, o);
    argmax_take(best, at, v, i);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) values[warp] = best, indices[warp] = at;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    best = lane < warps ? values[lane] : -INFINITY;
    at = lane < warps ? indices[lane] : kNoIndex;
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t i = __shfl_xor_sync(0xffffffffu, at, o);
      argmax_take(best, at, v, i);
    }
  }
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab, float* part_value,
                                                                int32_t* part_index, int32_t* arrivals, int32_t* out) {
  kernel_entry();
  const int64_t row = blockIdx.x / kArgmaxBlocks;
  const int slice = blockIdx.x % kArgmaxBlocks;
  const int64_t per = (vocab + kArgmaxBlocks - 1) / kArgmaxBlocks;
  const int64_t begin = slice * per, end = begin + per < vocab ? begin + per : vocab;
  const float* x = logits + row * vocab;
  float best = -INFINITY;
  int32_t at = kNoIndex;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    if (v == v) argmax_take(best, at, v, int32_t(i));
  }
  block_argmax(best, at);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    part_value[blockIdx.x] = best;
    part_index[blockIdx.x] = at;
    __threadfence();
    last = atomicAdd(&arrivals[row], 1) == kArgmaxBlocks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  best = -INFINITY;
  at = kNoIndex;
  if (threadIdx.x < kArgmaxBlocks)
    best = __ldcg(&part_value[row * kArgmaxBlocks + threadIdx.x]),
    at = __ldcg(&part_index[row * kArgmaxBlocks + threadIdx.x]);
  block_argmax(best, at);
  if (threadIdx.x == 0) {
    out[row] = at == kNoIndex ? 0 : at;  // every logit NaN: index 0, as the host argmax
    arrivals[row] = 0;
  }
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
// comes free); 2: x = silu(gate) * up of a [gate | up] row of width 2K (with the fast exp and divide). Partial
// sums: warp shuffles, then the 8 warps in shared memory (deterministic).
template <int CH, int R, int XMODE>
__global__ void __launch_bounds__(kThreads) dense_rows_matvec(MatrixRef w, const float* x,
                                                              const float* norm_weight, float eps,
                                                              float* y, bool accumulate) {
  __shared__ float shared[kWarps * R];
  __shared__ float reduce[32];
  const int64_t cols = w.cols, chunks = cols / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int RU = (8 / CH) > R ? R : ((8 / CH) < 1 ? 1 : 8 / CH);
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const uint4* base = static_cast<const uint4*>(w.data);  // a row is `chunks` words
  // Software-pipelined over groups of RU rows: the next group's words are loaded before this group's are used.
  // The first group's loads and an L2 prefetch of the block's other rows go out before the wait (and before the
  // x prologue below, which would otherwise leave HBM idle while every block loads and transforms x).
  uint4 raw[RU][CH];
  auto load = [&](int r0) {
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      const int64_t row = min(row0 + r0 + r, w.rows - 1);  // a clamped row is read but never written
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const int64_t chunk = threadIdx.x + int64_t(c) * kThreads;
        raw[r][c] = chunk < chunks ? __ldcs(base + row * chunks + chunk) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  let_next_kernel_start();
  load(0);
  if (R > RU && row0 + RU < w.rows)
    prefetch_l2(base + (row0 + RU) * chunks, uint64_t(min(int64_t(R - RU), w.rows - row0 - RU)) * chunks * 16);
  wait_for_previous_kernel();
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
      // Every block recomputes the whole activation row, so the fast intrinsics (~2 ulp): with expf and a true
      // division this prologue cost ~5.6 us of an 8192-column down projection (H100, measured).
#pragma unroll
      for (int e = 0; e < 8; ++e) xr[c][e] = __fdividef(g[e], 1.0f + __expf(-g[e])) * u[e];
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
#pragma unroll
  for (int r0 = 0; r0 < R; r0 += RU) {
    uint4 cur[RU][CH];
#pragma unroll
    for (int r = 0; r < RU; ++r)
#pragma unroll
      for (int c = 0; c < CH; ++c) cur[r][c] = raw[r][c];
    if (r0 + RU < R) load(r0 + RU);
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      float acc = 0;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        float wv[8];
        widen8(cur[r][c], w.format, wv);
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
  if (g_dense_rows == 8 || (g_dense_rows != 4 && w.rows >= 8 * 132)) {
    launch(dense_rows_matvec<CH, 8, XMODE>, unsigned((w.rows + 7) / 8), kThreads, 0, stream, w, x, norm_weight, eps, y, accumulate);
  } else {
    launch(dense_rows_matvec<CH, 4, XMODE>, unsigned((w.rows + 3) / 4), kThreads, 0, stream, w, x, norm_weight, eps, y, accumulate);
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
  kernel_entry();
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
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * stride) qkv[i] += bias[i % stride];
}

// Position t of a sequence's page table, as a K/V row index of the pool (times kv_heads, plus the KV head).
__device__ __forceinline__ int64_t kv_row(const int32_t* table, int64_t t, int64_t kv_heads, int64_t kvh) {
  return (int64_t(table[t / kKvPage]) * kKvPage + t % kKvPage) * kv_heads + kvh;
}

// Block per (row, head slot): slots [0, heads) are q heads, [heads, heads+kv) k heads, then kv v heads.

static_assert(kMaxHeadDim / 16 <= 32);  // q8 blocks of a head: rope_store_kernel's scales

__global__ void rope_store_kernel(float* qkv, QkvParams p, const int32_t* positions, KvRef kv, PageTables tables) {
  kernel_entry();
  __shared__ float shared[32];
  const int64_t slots = p.heads + 2 * p.kv_heads;
  const int64_t row = blockIdx.x / slots, slot = blockIdx.x % slots;
  const int64_t hd = p.head_dim, half = (p.rotary_dim > 0 ? p.rotary_dim : hd) / 2, stride = slots * hd;
  float* v = qkv + row * stride + slot * hd;
  const int32_t pos = positions[row];
  if (slot < p.heads + p.kv_heads) {
    for (int64_t j = threadIdx.x; p.inv_freq && j < half; j += blockDim.x) {  // null: the rows are turned already
      float s, c;
      sincosf(float(pos) * p.inv_freq[j], &s, &c);
      c *= p.rope_scale, s *= p.rope_scale;
      const float a = v[j], b = v[j + half];
      v[j] = a * c - b * s;
      v[j + half] = b * c + a * s;
    }
    __syncthreads();
    if (slot < p.heads) return;
  }
  const bool is_key = slot < p.heads + p.kv_heads;
  const int64_t kvh = is_key ? slot - p.heads : slot - p.heads - p.kv_heads;
  const int64_t at = kv_row(tables.pages + tables.seq_of_row[row] * tables.stride, pos, p.kv_heads, kvh);
  if (kv.codec == 0) {
    __half* dst = static_cast<__half*>(is_key ? kv.keys : kv.values) + at * hd;
    for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) dst[j] = __float2half(v[j]);
  } else if (kv.codec == 2) {
    float* dst = static_cast<float*>(is_key ? kv.keys : kv.values) + at * hd;
    for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) dst[j] = v[j];
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

// Eight K/V elements of pool row `at` starting at dim j, as floats.
__device__ __forceinline__ void kv_load8(const KvRef& kv, bool key, int64_t at, int64_t hd, int64_t j, float* out) {
  codec_load8(key ? kv.keys : kv.values, key ? kv.key_scales : kv.value_scales, kv.codec, at, hd, j, out);
}

constexpr int kSplitThreads = 128;
constexpr int kSplitWarps = kSplitThreads / 32;

// Positions per block of the split attention: one KV page (64), more (whole pages) only where max_len would need
// over 256 blocks per head. (Chunks of 128 or 256 positions were slower at every length on the H100: len 640
// decode 15.7 us -> 24.6 / 38.5 us; the block's dependent phases, not the grid, bound it.)
int64_t attention_chunk(int64_t max_len) {
  int64_t chunk = kKvPage;
  while ((max_len + chunk - 1) / chunk > 256) chunk *= 2;
  return chunk;
}

// Flash-decoding, one block per (row, KV head, chunk of positions): the chunk's keys and values are read once for
// every q head of the KV head's group (GQA), in 16-byte words. Scores: one thread per (q head, position) against q
// in shared memory; softmax per head by one warp; values: thread (position lane, 8-dim slice) accumulates all
// the group's heads at once, reduced over position lanes with shuffles, then over warps in shared memory. The
// unnormalized sums, the max and the exp-sum go to `partial` [row][q head][chunk][hd + 2]. A grid sized from
// max_len keeps the launch the same across steps (CUDA graphs); chunks past the row's length return at once.
// FUSED (decode: no two rows of the step share a sequence): the qkv rows are as the matvec left them; each block
// applies bias / per-head q norm / RoPE to its group's q itself, and the block of the chunk holding the row's
// position also prepares that position's K and V and writes them into the cache before it reads the chunk, which
// saves the separate bias / norm / rope-and-store launches.
constexpr int kAttentionSums = kSplitThreads * 8;  // floats of shared memory for the value sums (>= 2 * head_dim)
// The widest head: the fused step's K and V vectors share the sums area, and a pass of the values needs one head's
// 8-dim slices in one block (a thread each).
static_assert(2 * kMaxHeadDim <= kAttentionSums && kMaxHeadDim / 8 <= kSplitThreads);

// One warp: v (hd floats in shared memory) = rope(norm(v + bias)) at pos, with the arithmetic of bias_kernel,
// rms_norm_kernel (norm width hd) and rope_store_kernel; bias and norm may be null.
__device__ void prepare_head_vector(float* v, int64_t hd, const float* bias, const float* norm, float eps, bool rope,
                                    int32_t pos, const float* inv_freq, float rope_scale, int64_t rotary_dim) {
  const int lane = threadIdx.x % 32;
  float squares = 0;
  for (int64_t j = lane; j < hd; j += 32) {
    const float x = bias ? v[j] + bias[j] : v[j];
    v[j] = x;
    squares += x * x;
  }
  if (norm) {
    const float inv = rsqrtf(warp_sum(squares) / float(hd) + eps);
    for (int64_t j = lane; j < hd; j += 32) v[j] = norm[j] * (v[j] * inv);
  }
  __syncwarp();
  if (rope) {
    const int64_t half = (rotary_dim > 0 ? rotary_dim : hd) / 2;
    for (int64_t j = lane; j < half; j += 32) {
      float s, c;
      sincosf(float(pos) * inv_freq[j], &s, &c);
      c *= rope_scale, s *= rope_scale;
      const float a = v[j], b = v[j + half];
      v[j] = a * c - b * s;
      v[j + half] = b * c + a * s;
    }
  }
  __syncwarp();
}

// One warp writes a K or V vector (shared memory) at pool row `at` in the codec (rope_store_kernel's arithmetic),
// and the same bytes into copy_row / copy_scales (the block's staged chunk) when given.
__device__ void store_kv_vector(const float* v, int64_t hd, const KvRef& kv, bool key, int64_t at,
                                void* copy_row = nullptr, float* copy_scales = nullptr) {
  const int lane = threadIdx.x % 32;
  if (kv.codec == 0) {
    __half* dst = static_cast<__half*>(key ? kv.keys : kv.values) + at * hd;
    for (int64_t j = lane; j < hd; j += 32) {
      const __half x = __float2half(v[j]);
      dst[j] = x;
      if (copy_row) static_cast<__half*>(copy_row)[j] = x;
    }
    return;
  }
  if (kv.codec == 2) {
    float* dst = static_cast<float*>(key ? kv.keys : kv.values) + at * hd;
    for (int64_t j = lane; j < hd; j += 32) {
      dst[j] = v[j];
      if (copy_row) static_cast<float*>(copy_row)[j] = v[j];
    }
    return;
  }
  const int block = q8_block(hd), nb = int(hd / block);
  float* scales = (key ? kv.key_scales : kv.value_scales) + at * nb;
  int8_t* dst = static_cast<int8_t*>(key ? kv.keys : kv.values) + at * hd;
  for (int64_t j = lane; j < hd; j += 32) {
    const int64_t b = j / block;
    float amax = 0;
    for (int k = 0; k < block; ++k) amax = fmaxf(amax, fabsf(v[b * block + k]));
    const float scale = __half2float(__float2half_rn(amax / 127.0f)), inv = scale > 0 ? 1.0f / scale : 0.0f;
    const int8_t code = int8_t(fminf(fmaxf(roundf(v[j] * inv), -127.0f), 127.0f));
    dst[j] = code;
    if (copy_row) static_cast<int8_t*>(copy_row)[j] = code;
    if (j % block == 0) {
      scales[b] = scale;
      if (copy_scales) copy_scales[b] = scale;
    }
  }
}

// HD: the head dim at compile time (64, 128) so the key loads of a position go out together; 0: p.head_dim.
template <bool FUSED, int HD>
__global__ void __launch_bounds__(kSplitThreads) attention_group_kernel(const float* qkv, QkvParams p,
                                                                       const int32_t* positions, KvRef kv,
                                                                       PageTables tables, int64_t chunk,
                                                                       int64_t chunks, float* partial,
                                                                       int32_t* arrivals, float* out, int debug,
                                                                       bool stage) {
  // q[group][hd], scores[group][chunk], sums[kAttentionSums], then with `stage`: the chunk's keys and values in the
  // codec ([chunk][hd] each) and, for q8, their scales ([chunk][hd / q8_block] each).
  extern __shared__ float dynamic[];
  let_next_kernel_start();
  if (FUSED && stage) {
    // Decode: the chunk's positions before this step's (written by earlier steps) depend on nothing this step
    // computes, so they are copied into shared memory before the wait, while the qkv matvec finishes; after it,
    // only this step's position (which this kernel writes) is missing, and the block that writes it adds it here
    // too. The scores and values passes then read shared memory only.
    const int64_t hd = HD > 0 ? HD : p.head_dim, group = p.heads / p.kv_heads;
    const int64_t rkvh = int(blockIdx.x) / int(chunks), r = int(rkvh) / int(p.kv_heads), h = int(rkvh) % int(p.kv_heads);
    const int64_t t0 = (int(blockIdx.x) % int(chunks)) * chunk;
    const int64_t older = min(int64_t(positions[r]), t0 + chunk) - t0;
    const int32_t* table = tables.pages + tables.seq_of_row[r] * tables.stride;
    const int64_t row_bytes = kv_row_bytes(kv.codec, hd), words = row_bytes / 16;
    char* staged_k = reinterpret_cast<char*>(dynamic + group * hd + group * chunk + kAttentionSums);
    char* staged_v = staged_k + chunk * row_bytes;
    for (int64_t idx = threadIdx.x; idx < older * words; idx += blockDim.x) {
      const int64_t t = idx / words, w = idx % words;
      const int64_t at = kv_row(table, t0 + t, p.kv_heads, h);
      const uint4 kw = *reinterpret_cast<const uint4*>(static_cast<const char*>(kv.keys) + at * row_bytes + w * 16);
      const uint4 vw = *reinterpret_cast<const uint4*>(static_cast<const char*>(kv.values) + at * row_bytes + w * 16);
      *reinterpret_cast<uint4*>(staged_k + t * row_bytes + w * 16) = kw;
      *reinterpret_cast<uint4*>(staged_v + t * row_bytes + w * 16) = vw;
    }
    if (kv.codec == 1) {
      const int64_t nb = hd / q8_block(hd);
      float* ks = reinterpret_cast<float*>(staged_v + chunk * row_bytes);
      float* vs = ks + chunk * nb;
      for (int64_t idx = threadIdx.x; idx < older * nb; idx += blockDim.x) {
        const int64_t t = idx / nb, b = idx % nb, at = kv_row(table, t0 + t, p.kv_heads, h);
        ks[idx] = kv.key_scales[at * nb + b];
        vs[idx] = kv.value_scales[at * nb + b];
      }
    }
  } else if (!(debug & 16)) {
    // The chunk's keys and values of positions before this step do not depend on the previous kernel: pull their
    // rows into L2 while it finishes (page tables and positions come from the step's upload, before any kernel).
    const int64_t hd = p.head_dim, rkvh = int(blockIdx.x) / int(chunks), r = int(rkvh) / int(p.kv_heads),
                  h = int(rkvh) % int(p.kv_heads);
    const int64_t t0 = (int(blockIdx.x) % int(chunks)) * chunk, end = min(int64_t(positions[r]) + 1, t0 + chunk);
    const int32_t* table = tables.pages + tables.seq_of_row[r] * tables.stride;
    const int64_t row_bytes = kv_row_bytes(kv.codec, hd);
    for (int64_t t = t0 + threadIdx.x; t < end; t += blockDim.x) {
      const int64_t at = kv_row(table, t, p.kv_heads, h);
      prefetch_l2_thread(static_cast<const char*>(kv.keys) + at * row_bytes, uint32_t(row_bytes));
      prefetch_l2_thread(static_cast<const char*>(kv.values) + at * row_bytes, uint32_t(row_bytes));
    }
  }
  wait_for_previous_kernel();
  if (debug & 1024) return;
  const int64_t hd = HD > 0 ? HD : p.head_dim, group = p.heads / p.kv_heads;
  const int64_t row_kvh = int(blockIdx.x) / int(chunks), part = int(blockIdx.x) % int(chunks);
  const int64_t row = int(row_kvh) / int(p.kv_heads), kvh = int(row_kvh) % int(p.kv_heads);
  const int64_t len = int64_t(positions[row]) + 1;
  // A windowed layer: positions [lo, len); chunks wholly before lo take no part (nor count in the merge).
  const int64_t lo = p.window > 0 ? max(int64_t(0), len - p.window) : 0, first_live = lo / chunk;
  const int64_t t0 = part * chunk, n = min(len - t0, chunk);
  if (n <= 0 || part < first_live) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t stride = (p.heads + 2 * p.kv_heads) * hd;
  const int32_t* table = tables.pages + tables.seq_of_row[row] * tables.stride;
  // A chunk of one page (the usual case) needs one page-table lookup for all its positions.
  const bool one_page = chunk == kKvPage;
  const int64_t page_base = one_page ? int64_t(table[t0 / kKvPage]) * kKvPage : 0;
  auto row_at = [&](int64_t t) {  // K/V row of chunk position t
    return one_page ? (page_base + t) * p.kv_heads + kvh : kv_row(table, t0 + t, p.kv_heads, kvh);
  };
  float* q = dynamic;
  float* sc = q + group * hd;
  float* sums = sc + group * chunk;  // kAttentionSums floats
  const int64_t row_bytes = kv_row_bytes(kv.codec, hd), nb = hd / q8_block(hd);
  char* staged_k = reinterpret_cast<char*>(sums + kAttentionSums);
  char* staged_v = staged_k + chunk * row_bytes;
  float* staged_ks = reinterpret_cast<float*>(staged_v + chunk * row_bytes);
  float* staged_vs = staged_ks + chunk * nb;
  stage = FUSED && stage;
  const float scale = rsqrtf(float(hd));
  const float* q_src = qkv + row * stride + kvh * group * hd;
  if (FUSED && !(debug & 32)) {
    const int32_t pos = positions[row];
    for (int64_t j = threadIdx.x; j < group * hd; j += blockDim.x) q[j] = q_src[j];
    __syncthreads();
    for (int64_t h = warp; h < group; h += kSplitWarps)
      prepare_head_vector(q + h * hd, hd, p.bias ? p.bias + (kvh * group + h) * hd : nullptr, p.q_norm, p.eps, true,
                          pos, p.inv_freq, p.rope_scale, p.rotary_dim);
    if (part == int64_t(pos) / chunk && warp < 2) {
      // Warp 0: this position's key, warp 1: its value (in the still unused sums area).
      const bool key = warp == 0;
      const int64_t q_rows = p.heads * hd, kv_rows = p.kv_heads * hd;
      const int64_t offset = q_rows + (key ? 0 : kv_rows) + kvh * hd;
      float* v = sums + (key ? 0 : hd);
      for (int64_t j = lane; j < hd; j += 32) v[j] = qkv[row * stride + offset + j];
      __syncwarp();
      prepare_head_vector(v, hd, p.bias ? p.bias + offset : nullptr, key ? p.k_norm : nullptr, p.eps, key, pos,
                          p.inv_freq, p.rope_scale, p.rotary_dim);
      const int64_t t = int64_t(pos) - t0;  // the chunk position of this step's row
      store_kv_vector(v, hd, kv, key, kv_row(table, pos, p.kv_heads, kvh),
                      stage ? (key ? staged_k : staged_v) + t * row_bytes : nullptr,
                      stage && kv.codec == 1 ? (key ? staged_ks : staged_vs) + t * nb : nullptr);
    }
    __syncthreads();  // the cache writes above are visible to the whole block from here
    for (int64_t j = threadIdx.x; j < group * hd; j += blockDim.x) q[j] *= scale;
  } else {
    for (int64_t j = threadIdx.x; j < group * hd; j += blockDim.x) q[j] = q_src[j] * scale;
  }
  __syncthreads();
  if (debug & 512) return;
  for (int idx = (debug & 64) ? int(group * n) : int(threadIdx.x); idx < int(group * n); idx += blockDim.x) {
    const int64_t h = idx / int(n), t = idx % int(n);
    const int64_t at = row_at(t);
    const float* qh = q + h * hd;
    float s = 0;
#pragma unroll 16
    for (int64_t j = 0; j < hd; j += 8) {
      float k[8] = {};
      if (!(debug & 4)) {
        if (stage)
          codec_load8(staged_k, staged_ks, kv.codec, t, hd, j, k);
        else
          kv_load8(kv, true, at, hd, j, k);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) s += qh[j + e] * k[e];
    }
    sc[h * chunk + t] = t0 + t < lo ? -INFINITY : s;  // before the window: weight 0 (the chunk holds lo: m finite)
  }
  __syncthreads();
  float* out_base = partial + ((row * p.heads + kvh * group) * chunks + part) * (hd + 2);
  const int64_t head_stride = chunks * (hd + 2);
  for (int64_t h = warp; h < group; h += kSplitWarps) {
    float* s_h = sc + h * chunk;
    float m = -INFINITY;
    for (int64_t t = lane; t < n; t += 32) m = fmaxf(m, s_h[t]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0;
    for (int64_t t = lane; t < n; t += 32) {
      const float e = __expf(s_h[t] - m);
      s_h[t] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      out_base[h * head_stride + hd] = m;
      out_base[h * head_stride + hd + 1] = l;
    }
  }
  __syncthreads();
  // Values: a thread takes one (q head, 8-dim slice) of a pass and every position_groups-th position, and keeps
  // 8 sums; a pass covers as many of the group's heads as give every thread of a position group a combination.
  // The sums of the position groups are added in shared memory.
  const int64_t slices = hd / 8;
  const int64_t heads_per_pass = max(int64_t(1), min(group, int64_t(kSplitThreads) / slices));
  for (int64_t h0 = (debug & 128) ? group : 0; h0 < group; h0 += heads_per_pass) {
    const int64_t heads_now = min(group - h0, heads_per_pass), combos = heads_now * slices;
    const int64_t position_groups = kSplitThreads / combos;
    const int64_t combo = threadIdx.x % combos, pg = threadIdx.x / combos;
    const int64_t slice = combo % slices;
    if (pg < position_groups) {
      const float* w = sc + (h0 + combo / slices) * chunk;
      float acc[8] = {};
      // Eight positions' loads are issued before any is used (one memory round trip per eight).
      for (int64_t t_base = pg; t_base < n; t_base += 8 * position_groups) {
        float v[8][8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int64_t t = t_base + k * position_groups;
          if (t < n && !(debug & 8)) {
            if (stage)
              codec_load8(staged_v, staged_vs, kv.codec, t, hd, slice * 8, v[k]);
            else
              kv_load8(kv, false, row_at(t), hd, slice * 8, v[k]);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[k][e] = 0.0f;
          }
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int64_t t = t_base + k * position_groups;
          const float wt = t < n ? w[t] : 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] += wt * v[k][e];
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sums[(pg * combos + combo) * 8 + e] = acc[e];  // = [pg][head][dim]
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < heads_now * hd; idx += blockDim.x) {
      float total = 0;
      for (int64_t g = 0; g < position_groups; ++g) total += sums[g * combos * 8 + idx];
      out_base[(h0 + idx / hd) * head_stride + idx % hd] = total;
    }
    __syncthreads();
  }
  // The last live chunk block of (row, KV head) to finish merges the group's chunks (no separate combine launch):
  // out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c. Partials of other blocks are read through L2 (__ldcg),
  // after the fences; the counter is reset for the next launch by the block that read it last.
  __shared__ bool last;
  __shared__ float weight[kSplitWarps][256];  // chunks <= 256 (attention_chunk)
  if (debug & 1) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t live = (len + chunk - 1) / chunk;
    last = atomicAdd(&arrivals[row_kvh], 1) == int(live - first_live - 1);
    if (last) arrivals[row_kvh] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t live = (len + chunk - 1) / chunk;
  const float* group_base = partial + (row * p.heads + kvh * group) * chunks * (hd + 2);
  for (int64_t h = warp; h < group; h += kSplitWarps) {
    const float* base = group_base + h * chunks * (hd + 2);
    // Each lane loads the max and the exp-sum of chunks lane, lane + 32, ... at once (live <= 256).
    float mc[8], lc[8], m = -INFINITY;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t c = first_live + lane + 32 * k;
      mc[k] = c < live ? __ldcg(base + c * (hd + 2) + hd) : -INFINITY;
      lc[k] = c < live ? __ldcg(base + c * (hd + 2) + hd + 1) : 0.0f;
      m = fmaxf(m, mc[k]);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    // An attention sink: its logit joins the denominator only (the max taken over it too, for range).
    const float sink = p.sinks ? p.sinks[kvh * group + h] : -INFINITY;
    m = fmaxf(m, sink);
    float den = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t c = first_live + lane + 32 * k;
      if (c >= live) break;
      const float f = __expf(mc[k] - m);
      weight[warp][c] = f;
      den += f * lc[k];
    }
    den = warp_sum(den);
    if (p.sinks) den += __expf(sink - m);
    __syncwarp();
    for (int64_t j = lane; j < hd; j += 32) {
      float num = 0;
#pragma unroll 8
      for (int64_t c = first_live; c < live; ++c) num += weight[warp][c] * __ldcg(base + c * (hd + 2) + j);
      out[(row * p.heads + kvh * group + h) * hd + j] = num / den;
    }
    __syncwarp();
  }
}

// Block per (row, q head): out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c over the row's live chunks.
__global__ void silu_gate_kernel(const float* gu, int64_t rows, int64_t inter, float* out) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, j = i % inter;
  const float g = gu[r * 2 * inter + j];
  out[i] = g / (1.0f + expf(-g)) * gu[r * 2 * inter + inter + j];
}

__global__ void add_kernel(float* y, const float* x, int64_t count) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] += x[i];
}

__global__ void gather_kernel(const float* src, const int32_t* index, int64_t rows, int64_t width, float* dst) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  dst[i] = src[int64_t(index[i / width]) * width + i % width];
}

// Rows of one expert are distinct, so no two threads of a launch touch the same element.
__global__ void scatter_add_kernel(const float* src, const int32_t* index, const float* weight, int64_t rows,
                                   int64_t width, float* dst) {
  kernel_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t r = i / width;
  dst[int64_t(index[r]) * width + i % width] += weight[r] * src[i];
}

__global__ void sigmoid_gate_add_kernel(const float* x, const float* gate, const float* y, int64_t width,
                                        float* hidden) {
  kernel_entry();
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

void set_programmatic_launch(bool on) { detail::g_programmatic = on; }
void set_dense_rows_per_block(int rows) { g_dense_rows = rows; }
void set_attention_debug(int mask) { g_attention_debug = mask; }

bool dense_fusable(const MatrixRef& w) {
  return (w.format == 1 || w.format == 2) && w.cols % 8 == 0 && w.cols <= 8 * kThreads * 8;
}

bool decode_fusable(const MatrixRef& w) {
  return dense_fusable(w) || (w.format >= 3 && w.format < kMxfp4Format && w.cols <= kMaxStagedCols && w.cols % 32 == 0);
}

void matvec_normed(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                   bool accumulate, cudaStream_t stream) {
  if (packed_mma_takes(w))
    packed_mma_matvec(w, x, 1, norm_weight, eps, y, accumulate, stream);
  else if (w.format >= 3)
    launch_packed_fused<1>(w, x, norm_weight, eps, y, accumulate, stream);
  else
    launch_dense_rows_any<1>(w, x, norm_weight, eps, y, accumulate, stream);
}

void matvec_gated(const MatrixRef& w, const float* gate_up, float* y, bool accumulate, cudaStream_t stream) {
  if (packed_mma_takes(w))
    packed_mma_matvec(w, gate_up, 2, nullptr, 0.0f, y, accumulate, stream);
  else if (w.format >= 3)
    launch_packed_fused<2>(w, gate_up, nullptr, 0.0f, y, accumulate, stream);
  else
    launch_dense_rows_any<2>(w, gate_up, nullptr, 0.0f, y, accumulate, stream);
}

void matvec(const MatrixRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
            cudaStream_t stream) {
  if (w.format == kMxfp4Format) {
    mxfp4_matvec(w, x, ldx, n, y, ldy, accumulate, stream);
    return;
  }
  if (n == 1 && g_dense_rows >= 0 && dense_fusable(w)) {
    launch_dense_rows_any<0>(w, x, nullptr, 0.0f, y, accumulate, stream);
    return;
  }
  if (n == 1 && packed_mma_takes(w)) {
    packed_mma_matvec(w, x, 0, nullptr, 0.0f, y, accumulate, stream);
    return;
  }
  switch (n) {
    case 1: launch_matvec<1>(w, x, ldx, y, ldy, accumulate, stream); break;
    case 2: launch_matvec<2>(w, x, ldx, y, ldy, accumulate, stream); break;
    case 3: launch_matvec<3>(w, x, ldx, y, ldy, accumulate, stream); break;
    default: launch_matvec<4>(w, x, ldx, y, ldy, accumulate, stream); break;
  }
}

void embed_rows(const MatrixRef& w, const int32_t* tokens, int64_t rows, float* out, cudaStream_t stream) {
  const int64_t total = rows * w.cols;
  if (total > 0) launch(embed_kernel, blocks_for(total), 256, 0, stream, w, tokens, rows, out);
}

int64_t argmax_scratch_bytes(int64_t max_rows) { return max_rows * 4 + max_rows * kArgmaxBlocks * 8; }

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, void* scratch, int64_t max_rows, int32_t* out,
                 cudaStream_t stream) {
  if (rows <= 0) return;
  // The counters first, at the same place whatever the rows (they must stay zero between calls).
  int32_t* arrivals = static_cast<int32_t*>(scratch);
  float* part_value = reinterpret_cast<float*>(arrivals + max_rows);
  int32_t* part_index = reinterpret_cast<int32_t*>(part_value + max_rows * kArgmaxBlocks);
  launch(argmax_kernel, unsigned(rows * kArgmaxBlocks), kArgmaxThreads, 0, stream, logits, vocab, part_value,
         part_index, arrivals, out);
}

void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t cols, int64_t width, float eps,
              float* out, int64_t ldout, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / width);
  if (blocks > 0) launch(rms_norm_kernel, unsigned(blocks), 256, 0, stream, x, ldx, weight, cols, width, eps, out, ldout);
}

void qkv_rope_store(float* qkv, int64_t rows, const QkvParams& p, const int32_t* positions, const KvRef& kv,
                    const PageTables& tables, cudaStream_t stream) {
  const int64_t stride = (p.heads + 2 * p.kv_heads) * p.head_dim;
  if (p.bias) launch(bias_kernel, blocks_for(rows * stride), 256, 0, stream, qkv, rows, stride, p.bias);
  if (p.q_norm) {
    rms_norm(qkv, stride, p.q_norm, rows, p.heads * p.head_dim, p.qn, p.eps, qkv, stride, stream);
    rms_norm(qkv + p.heads * p.head_dim, stride, p.k_norm, rows, p.kv_heads * p.head_dim, p.kn, p.eps,
             qkv + p.heads * p.head_dim, stride, stream);
  }
  const int64_t blocks = rows * (p.heads + 2 * p.kv_heads);
  launch(rope_store_kernel, unsigned(blocks), 128, 0, stream, qkv, p, positions, kv, tables);
}

int64_t attention_scratch_floats(int64_t rows, const QkvParams& p, int64_t max_len) {
  const int64_t chunk = attention_chunk(max_len);
  return rows * p.heads * ((max_len + chunk - 1) / chunk) * (p.head_dim + 2);
}

void attention(const float* qkv, int64_t rows, const QkvParams& p, const int32_t* positions, const KvRef& kv,
               const PageTables& tables, int64_t max_len, bool fused, float* partial, int32_t* arrivals, float* out,
               cudaStream_t stream) {
  const int64_t chunk = attention_chunk(max_len), chunks = (max_len + chunk - 1) / chunk;
  const int64_t group = p.heads / p.kv_heads;
  size_t shared = size_t(group * p.head_dim + group * chunk + kAttentionSums) * 4;
  // Decode stages the chunk's K/V in shared memory (see the kernel) where that fits.
  const size_t row_bytes = size_t(kv_row_bytes(kv.codec, p.head_dim));
  const size_t staged = 2 * size_t(chunk) * row_bytes + (kv.codec != 1 ? 0 : 2 * size_t(chunk) * size_t(p.head_dim / q8_block(p.head_dim)) * 4);
  const bool stage = fused && g_attention_stage && !(g_attention_debug & 2048) && shared + staged <= (160 << 10);
  if (stage) shared += staged;
  auto kernel = p.head_dim == 64    ? (fused ? attention_group_kernel<true, 64> : attention_group_kernel<false, 64>)
                : p.head_dim == 128 ? (fused ? attention_group_kernel<true, 128> : attention_group_kernel<false, 128>)
                                    : (fused ? attention_group_kernel<true, 0> : attention_group_kernel<false, 0>);
  launch(kernel, unsigned(rows * p.kv_heads * chunks),
         kSplitThreads, shared, stream, qkv, p, positions, kv, tables, chunk, chunks, partial, arrivals, out,
         g_attention_debug, stage);
}

bool experts_routable(const ExpertMatrixRef& gate_up, const ExpertMatrixRef& down, int64_t experts, int64_t k) {
  return decode_fusable(gate_up.shape) && decode_fusable(down.shape) && gate_up.shape.format >= 3 &&
         down.shape.format >= 3 && gate_up.shape.format < kMxfp4Format && down.shape.format < kMxfp4Format && experts <= 32 * kRouteMaxPerLane && k >= 1 && k <= 32 && k <= experts;
}

void route_topk(const float* logits, int64_t rows, int64_t experts, int64_t k, bool renormalize, int32_t* ids,
                float* weights, cudaStream_t stream) {
  launch(route_topk_kernel, unsigned(rows), 32, 0, stream, logits, int(experts), int(k), renormalize, ids, weights);
}

void routed_experts(const ExpertMatrixRef& gate_up, const ExpertMatrixRef& down, const void* const* blocks,
                    const int32_t* ids, const float* weights, int64_t rows, int64_t k_per_row, const float* x,
                    float* gate_up_out, float* down_out, float* hidden, cudaStream_t stream) {
  const int64_t inter = down.shape.cols, width = down.shape.rows, k = rows * k_per_row;
  {  // gate_up of every routed expert: k x 2I outputs
    const int64_t panels = (gate_up.shape.rows + 15) / 16;
    const bool wide = panels * k < 2 * 132;
    auto kernel = gate_up.shape.bits == 8 ? (wide ? expert_matvec<8, 32, 0> : expert_matvec<8, kWarps, 0>)
                                          : (wide ? expert_matvec<4, 32, 0> : expert_matvec<4, kWarps, 0>);
    launch(kernel, unsigned(panels * k), wide ? 1024 : kThreads, 0, stream, gate_up, blocks, ids, panels, x,
           k_per_row, width, static_cast<const float*>(nullptr), gate_up_out, 2 * inter);
  }
  {  // down with the SiLU gate fused and the routing weight applied: k x H outputs
    const int64_t panels = (down.shape.rows + 15) / 16;
    const bool wide = panels * k < 2 * 132;
    const size_t shared = size_t(inter) * 4;
    auto kernel = down.shape.bits == 8 ? (wide ? expert_matvec<8, 32, 2> : expert_matvec<8, kWarps, 2>)
                                       : (wide ? expert_matvec<4, 32, 2> : expert_matvec<4, kWarps, 2>);
    launch(kernel, unsigned(panels * k), wide ? 1024 : kThreads, shared, stream, down, blocks, ids, panels,
           static_cast<const float*>(gate_up_out), int64_t(1), 2 * inter, weights, down_out, width);
  }
  launch(moe_combine_kernel, blocks_for(rows * width), 256, 0, stream, static_cast<const float*>(down_out),
         int(k_per_row), rows, width, hidden);
}

void silu_gate(const float* gate_up, int64_t rows, int64_t intermediate, float* out, cudaStream_t stream) {
  launch(silu_gate_kernel, blocks_for(rows * intermediate), 256, 0, stream, gate_up, rows, intermediate, out);
}

void add(float* y, const float* x, int64_t count, cudaStream_t stream) {
  launch(add_kernel, blocks_for(count), 256, 0, stream, y, x, count);
}

void gather_rows(const float* src, const int32_t* index, int64_t rows, int64_t width, float* dst, cudaStream_t stream) {
  launch(gather_kernel, blocks_for(rows * width), 256, 0, stream, src, index, rows, width, dst);
}

void scatter_add_rows(const float* src, const int32_t* index, const float* weight, int64_t rows, int64_t width,
                      float* dst, cudaStream_t stream) {
  launch(scatter_add_kernel, blocks_for(rows * width), 256, 0, stream, src, index, weight, rows, width, dst);
}

void sigmoid_gate_add(const float* x, const float* gate, const float* y, int64_t rows, int64_t width, float* hidden,
                      cudaStream_t stream) {
  launch(sigmoid_gate_add_kernel, unsigned(rows), 256, 0, stream, x, gate, y, width, hidden);
}

}  // namespace tierlm::gpu::device
