// runtime/gpu/packed_decode.cu — the decode matvec (one x row) of packed weights (q8_0, q4, MLX) on the tensor
// cores. The CUDA-core kernel (device_kernels.cu) spends ~3 instructions a weight (byte to float, subtract, FMA) and
// was bound by them: a 16384 x 2048 matrix took ~22 us in q8_0, q4 and bf16 alike (H100), twice its bytes' time.
// Here a weight costs a byte permute (1024 + u as f16, exact) and half a subtraction, and 256 of them go through one
// mma.m16n8k16 (f16 x f16, f32 accumulation).
// x keeps f32 accuracy: it is split into hi = f16(x) and lo = f16(x - hi), the two columns of the mma's B operand
// (hi in column 0, lo in column 1, the other six zero), so each product's error is ~2^-22 of |x| instead of f16's
// 2^-11; the row's result is column 0 + column 1, scaled per group in f32 (d * sum + m * sum(x) for affine formats).
// Measured (H200, gpu_bench chains): q8_0 16384 x 2048 normed 22.8 -> 17.5 us, head 113 -> 101 us, the small
// matrices unchanged; llama-1B q8_0 decode +12%. Per shape (H200, 2026-11-27, gpu_bench chains, both widths): it
// wins on matrices of many panels (16384 x 2048, the 8B gate_up 28672 x 4096, the heads: 10-22% faster) and loses
// on the short ones (o, down: the CUDA-core kernel is up to 27% faster on 4-bit 4096 x 14336), so by default it
// takes matrices of at least kMmaMinRows rows, and 8-bit ones of at least kMmaMinCols8 columns, where it stayed
// ahead (q8_0 down 4096 x 14336 gated 31.3 vs 32.4 us, 2048 x 8192 gated 9.2 vs 9.7) (packed_mma_takes).
// Persistent blocks (a block walking several panels with one staging of x) measured slower on every shape they
// took (6144 x 4096 q8_0 14.7 -> 23.0 us, the 8B head 166 -> 214 us): fewer warps in flight, not the blocks' fixed
// cost, bound these kernels. Nor did 8 chunks of 4-bit words in flight a lane instead of 4 help (8B q4 decode
// 246 -> 235 tok/s).
//
// Layout (kernel_isa.h): a 16-row panel walks columns in quads of 4 (64 bytes: row r at [4r, 4r+4)); 4-bit panels
// hold 32-column blocks of 256 bytes whose chunk c has quad 8b+c in the low nibbles and 8b+c+4 in the high ones. The
// mma's rows and k indices are permuted so that a lane's A fragment is 8 contiguous bytes: mma row g <-> panel row
// 2g and row g+8 <-> 2g+1 (lane g = lane/4 reads rows 2g and 2g+1, adjacent words), and for a 16-column step at
// column c0, mma k = 2t+e <-> c0+4t+e, k = 2t+8+e <-> c0+4t+2+e (lane t = lane%4 reads quad t of the step). B uses
// the same k permutation, so the products are the matrix's.
// A block per panel, 8 warps (32 for matrices of few panels) splitting the columns in 32-column chunks; a warp
// stages its own columns of x (normed or gated on the way) as f16 hi/lo pairs in shared memory, and its weight words
// (2-4 chunks ahead) are loaded before the programmatic-launch wait, like the other decode kernels'. Partial sums:
// the warps in shared memory, in order.
#include "runtime/gpu/device_kernels.cuh"
#include "runtime/gpu/device_launch.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>

namespace tierlm::gpu::device {

using namespace detail;

namespace {

constexpr int kMmaWarps = 8;
constexpr int64_t kMaxMmaCols = 40960;  // x staged as hi/lo halves: ~4.1 bytes a column of shared memory
// Matrices of fewer rows stay on the CUDA-core kernel (see the header; both widths measured).
constexpr int64_t kMmaMinRows = 6144, kMmaMinCols8 = 8192;
// TIERLM_GPU_PACKED_MMA: "0" none, "all" every packed matrix it can take, else those of kMmaMinRows rows or more
// (8-bit: or of kMmaMinCols8 columns or more).
bool g_packed_mma = [] {
  const char* v = std::getenv("TIERLM_GPU_PACKED_MMA");
  return !(v && std::string(v) == "0");
}();
bool g_packed_mma_all = [] {
  const char* v = std::getenv("TIERLM_GPU_PACKED_MMA");
  return v && std::string(v) == "all";
}();
// TIERLM_GPU_SCALES_AHEAD=0: the scale pairs loaded inside the compute loop (the kernel before AHEAD; A/B runs).
bool g_scales_ahead = [] {
  const char* v = std::getenv("TIERLM_GPU_SCALES_AHEAD");
  return !(v && std::string(v) == "0");
}();

__device__ __forceinline__ float2 load_scale_pair(const void* p, int type, int64_t i) {
  if (type == 0) return *reinterpret_cast<const float2*>(static_cast<const float*>(p) + i);
  if (type == 1) return __half22float2(*reinterpret_cast<const __half2*>(static_cast<const __half*>(p) + i));
  const uint32_t v = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p) + i);
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// Bytes (or nibbles, already masked into bytes) 0,1 (SEL 0x4140) or 2,3 (0x4342) of a word as half2(u - offset):
// 0x64 above a byte makes the f16 1024 + u exactly; the subtraction is exact too.
template <uint32_t SEL>
__device__ __forceinline__ uint32_t bytes_as_half2(uint32_t word, __half2 offset) {
  const uint32_t h = __byte_perm(word, 0x64646464u, SEL);
  const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&h), offset);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One 16-column step: the lane's words of rows 2g (w.x) and 2g+1 (w.y) as the A fragment, against B = (b0, b1).
__device__ __forceinline__ void mma_step(float (&c)[4], uint2 w, __half2 offset, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {bytes_as_half2<0x4140>(w.x, offset), bytes_as_half2<0x4140>(w.y, offset),
                         bytes_as_half2<0x4342>(w.x, offset), bytes_as_half2<0x4342>(w.y, offset)};
  mma16816(c, a, b0, b1);
}

// XMODE: 0 x as is, 1 x rms-normed by norm_weight (the norm's scale applied to the totals), 2 x = silu(gate) * up
// of a [gate | up] row of 2 * cols floats. Dynamic shared memory: per warp, hi and lo halves of its columns and
// the f32 sum of each of its chunks (WARPS * chunks_per_warp * (32 * 4 + 4) bytes).
// AHEAD: the warp's scales (and offsets) are prefetched toward L2 with its weights, and in blocks of 32 warps (2
// chunks a batch, registers to spare) each chunk's pair is loaded with its weight words, a batch ahead; without it,
// the pair is a dependent load from HBM inside the compute loop. (With 8 warps the pairs in registers spill.)
template <int BITS, int XMODE, int WARPS, bool AHEAD>
__global__ void __launch_bounds__(WARPS * 32) packed_mma_matvec(MatrixRef w, const float* x, const float* norm_weight,
                                                              float eps, float* y, bool accumulate,
                                                              int chunks_per_warp) {
  extern __shared__ __align__(16) unsigned char mma_shared[];
  __shared__ float partial[WARPS][16];
  __shared__ float warp_squares[WARPS];
  constexpr int kPairs = BITS == 8 ? 2 : 1;  // 8-byte words a lane reads per chunk
  // 32-column chunks whose weight words a lane has in flight (fewer in 1024-thread blocks: 64 registers a thread)
  constexpr int kMmaBatch = WARPS > 8 ? 2 : 4;
  constexpr bool kScalesInRegisters = AHEAD && WARPS > 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t cols = w.cols, panel = blockIdx.x, groups = cols / w.group_size;
  const int chunks = int(cols / 32), ch0 = warp * chunks_per_warp;
  const int mine = max(0, min(chunks_per_warp, chunks - ch0));
  const uint8_t* data = static_cast<const uint8_t*>(w.data) + panel * cols * 16 * BITS / 8;
  const bool affine = w.biases != nullptr;
  // Scales of rows 2g, 2g+1 of the chunk's group (group sizes are powers of two).
  const int group_shift = __ffs(w.group_size) - 1;
  const int64_t scales_at = panel * groups * 16 + 2 * g;
  // Per chunk: 8-bit: quads t and t+4 of its 8 (512 bytes); 4-bit: chunk t of its block (256 bytes).
  auto scale_at = [&](int i) { return scales_at + int64_t(((ch0 + i) * 32) >> group_shift) * 16; };
  auto load = [&](int i, uint2 (&words)[kPairs], float4& scale) {
    const int64_t ch = ch0 + i;
    if constexpr (BITS == 8) {
      words[0] = __ldcs(reinterpret_cast<const uint2*>(data + (ch * 8 + t) * 64 + 8 * g));
      words[1] = __ldcs(reinterpret_cast<const uint2*>(data + (ch * 8 + 4 + t) * 64 + 8 * g));
    } else {
      words[0] = __ldcs(reinterpret_cast<const uint2*>(data + ch * 256 + t * 64 + 8 * g));
    }
    if constexpr (kScalesInRegisters) {
      const float2 d = load_scale_pair(w.scales, w.scale_type, scale_at(i));
      const float2 m = affine ? load_scale_pair(w.biases, w.scale_type, scale_at(i)) : make_float2(0, 0);
      scale = make_float4(d.x, d.y, m.x, m.y);
    }
  };
  uint2 cur[kMmaBatch][kPairs], next[kMmaBatch][kPairs];
  float4 cur_scale[kMmaBatch], next_scale[kMmaBatch];
  let_next_kernel_start();
#pragma unroll
  for (int b = 0; b < kMmaBatch; ++b)
    if (b < mine) load(b, cur[b], cur_scale[b]);
  {  // the rest of the warp's columns (contiguous in the panel) toward L2; AHEAD: its scales (and offsets) too
    constexpr int64_t kChunkBytes = BITS == 8 ? 512 : 256;
    if (lane == 0 && mine > kMmaBatch)
      prefetch_l2_thread(data + (ch0 + kMmaBatch) * kChunkBytes, uint32_t((mine - kMmaBatch) * kChunkBytes));
    if (AHEAD && (lane == 1 || (lane == 2 && affine)) && mine > 0) {
      // a panel's scales: 16 per group, groups in column order, so the warp's groups are contiguous
      const int64_t size = w.scale_type == 0 ? 4 : 2;
      const int64_t first = scale_at(0) - 2 * g, last = scale_at(mine - 1) - 2 * g + 16;
      const uint8_t* base = static_cast<const uint8_t*>(lane == 1 ? w.scales : w.biases);
      prefetch_l2_thread(base + first * size, uint32_t((last - first) * size));
    }
  }
  wait_for_previous_kernel();

  // Stage this warp's columns of x: hi/lo halves, and the sum of each 32-column chunk (8 lanes of 4 columns).
  __half* xh = reinterpret_cast<__half*>(mma_shared) + int64_t(warp) * chunks_per_warp * 64;
  __half* xl = xh + chunks_per_warp * 32;
  float* chunk_sum =
      reinterpret_cast<float*>(reinterpret_cast<__half*>(mma_shared) + WARPS * chunks_per_warp * 64) +
      warp * chunks_per_warp;
  float squares = 0;
  for (int base = 0; base < mine * 32; base += 128) {  // whole warps: the chunk sums shuffle
    const int local = base + lane * 4;
    const bool on = local < mine * 32;  // the same for the 8 lanes of a chunk
    const int64_t c = int64_t(ch0) * 32 + local;
    float4 v = on ? *reinterpret_cast<const float4*>(x + c) : make_float4(0, 0, 0, 0);
    if constexpr (XMODE == 1) {
      squares += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      const float4 n = on ? *reinterpret_cast<const float4*>(norm_weight + c) : make_float4(0, 0, 0, 0);
      v = make_float4(v.x * n.x, v.y * n.y, v.z * n.z, v.w * n.w);
    } else if constexpr (XMODE == 2) {  // as the other fused kernels: the fast exp and divide
      const float4 u = on ? *reinterpret_cast<const float4*>(x + cols + c) : make_float4(0, 0, 0, 0);
      v = make_float4(__fdividef(v.x, 1.0f + __expf(-v.x)) * u.x, __fdividef(v.y, 1.0f + __expf(-v.y)) * u.y,
                      __fdividef(v.z, 1.0f + __expf(-v.z)) * u.z, __fdividef(v.w, 1.0f + __expf(-v.w)) * u.w);
    }
    if (on) {  // the 4 columns' hi and lo halves as one 8-byte store each (2-byte stores conflicted in the banks)
      const __half2 h01 = __floats2half2_rn(v.x, v.y), h23 = __floats2half2_rn(v.z, v.w);
      const float2 r01 = __half22float2(h01), r23 = __half22float2(h23);
      const __half2 l01 = __floats2half2_rn(v.x - r01.x, v.y - r01.y);
      const __half2 l23 = __floats2half2_rn(v.z - r23.x, v.w - r23.y);
      *reinterpret_cast<uint2*>(xh + local) = make_uint2(*reinterpret_cast<const uint32_t*>(&h01),
                                                         *reinterpret_cast<const uint32_t*>(&h23));
      *reinterpret_cast<uint2*>(xl + local) = make_uint2(*reinterpret_cast<const uint32_t*>(&l01),
                                                         *reinterpret_cast<const uint32_t*>(&l23));
    }
    float s = v.x + v.y + v.z + v.w;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (on && lane % 8 == 0) chunk_sum[local / 32] = s;
  }
  __syncwarp();

  // Symmetric formats (q8_0: w = d (u - 128)) take A = u - 128; affine ones A = u and add m * sum(x).
  const __half2 offset = __float2half2_rn(affine ? 1024.0f : 1152.0f);
  const __half* xb = g == 0 ? xh : xl;  // B column 0: hi, column 1: lo, columns 2-7: zero
  float acc0 = 0, acc1 = 0;              // panel rows 2g, 2g+1 (meaningful in lanes t == 0)
  for (int i0 = 0; i0 < mine; i0 += kMmaBatch) {
#pragma unroll
    for (int b = 0; b < kMmaBatch; ++b)
      if (i0 + kMmaBatch + b < mine) load(i0 + kMmaBatch + b, next[b], next_scale[b]);
#pragma unroll
    for (int b = 0; b < kMmaBatch; ++b) {
      const int i = i0 + b;
      if (i < mine) {
        uint2 b_lo = make_uint2(0, 0), b_hi = make_uint2(0, 0);
        if (g < 2) {
          b_lo = *reinterpret_cast<const uint2*>(xb + i * 32 + 4 * t);
          b_hi = *reinterpret_cast<const uint2*>(xb + i * 32 + 16 + 4 * t);
        }
        float c[4] = {0, 0, 0, 0};
        if constexpr (BITS == 8) {
          mma_step(c, cur[b][0], offset, b_lo.x, b_lo.y);
          mma_step(c, cur[b][1], offset, b_hi.x, b_hi.y);
        } else {
          const uint2 wd = cur[b][0];
          mma_step(c, make_uint2(wd.x & 0x0f0f0f0fu, wd.y & 0x0f0f0f0fu), offset, b_lo.x, b_lo.y);
          mma_step(c, make_uint2((wd.x >> 4) & 0x0f0f0f0fu, (wd.y >> 4) & 0x0f0f0f0fu), offset, b_hi.x, b_hi.y);
        }
        float2 d, m;
        if constexpr (kScalesInRegisters) {
          d = make_float2(cur_scale[b].x, cur_scale[b].y);
          m = make_float2(cur_scale[b].z, cur_scale[b].w);
        } else {
          d = load_scale_pair(w.scales, w.scale_type, scale_at(i));
          m = affine ? load_scale_pair(w.biases, w.scale_type, scale_at(i)) : make_float2(0, 0);
        }
        acc0 += d.x * (c[0] + c[1]);
        acc1 += d.y * (c[2] + c[3]);
        if (affine) {
          const float s = chunk_sum[i];
          acc0 += m.x * s;
          acc1 += m.y * s;
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kMmaBatch; ++b) {
#pragma unroll
      for (int p = 0; p < kPairs; ++p) cur[b][p] = next[b][p];
      cur_scale[b] = next_scale[b];
    }
  }
  if (t == 0) {
    partial[warp][2 * g] = acc0;
    partial[warp][2 * g + 1] = acc1;
  }
  if (XMODE == 1) {
    for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
    if (lane == 0) warp_squares[warp] = squares;
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int r = threadIdx.x;
    float total = 0;
    for (int k = 0; k < WARPS; ++k) total += partial[k][r];
    if (XMODE == 1) {
      float sum = 0;
      for (int k = 0; k < WARPS; ++k) sum += warp_squares[k];
      total *= rsqrtf(sum / float(cols) + eps);
    }
    const int64_t row = panel * 16 + r;
    if (row < w.rows) y[row] = accumulate ? y[row] + total : total;
  }
}

// Few panels (a short matrix such as o or down) get 32 warps a block, so the SMs still have loads enough in flight
// (as the CUDA-core kernel).
template <int XMODE, int WARPS>
void launch_mma_warps(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y,
                      bool accumulate, cudaStream_t stream) {
  const int chunks = int(w.cols / 32), per_warp = (chunks + WARPS - 1) / WARPS;
  const size_t shared = size_t(WARPS) * size_t(per_warp) * (32 * 2 * 2 + 4);
  auto kernel = g_scales_ahead
                    ? (w.bits == 8 ? packed_mma_matvec<8, XMODE, WARPS, true> : packed_mma_matvec<4, XMODE, WARPS, true>)
                    : (w.bits == 8 ? packed_mma_matvec<8, XMODE, WARPS, false> : packed_mma_matvec<4, XMODE, WARPS, false>);
  launch(kernel, unsigned((w.rows + 15) / 16), WARPS * 32, shared, stream, w, x, norm_weight, eps, y, accumulate,
         per_warp);
}

template <int XMODE>
void launch_mma(const MatrixRef& w, const float* x, const float* norm_weight, float eps, float* y, bool accumulate,
                cudaStream_t stream) {
  if ((w.rows + 15) / 16 < 2 * 132)
    launch_mma_warps<XMODE, 32>(w, x, norm_weight, eps, y, accumulate, stream);
  else
    launch_mma_warps<XMODE, kMmaWarps>(w, x, norm_weight, eps, y, accumulate, stream);
}

}  // namespace

void set_packed_mma(bool on, bool every_size) {
  g_packed_mma = on;
  g_packed_mma_all = every_size;
}

bool packed_mma_takes(const MatrixRef& w) {
  const bool power_of_two = w.group_size >= 32 && (w.group_size & (w.group_size - 1)) == 0;
  const bool bits = w.bits == 8 || w.bits == 4;
  const bool pays = w.rows >= kMmaMinRows || (w.bits == 8 && w.cols >= kMmaMinCols8);
  return g_packed_mma && (g_packed_mma_all || pays) && w.format >= 3 && bits && power_of_two &&
         w.cols % 32 == 0 && w.cols % w.group_size == 0 && w.cols <= kMaxMmaCols;
}

void packed_mma_matvec(const MatrixRef& w, const float* x, int xmode, const float* norm_weight, float eps, float* y,
                       bool accumulate, cudaStream_t stream) {
  if (xmode == 1)
    launch_mma<1>(w, x, norm_weight, eps, y, accumulate, stream);
  else if (xmode == 2)
    launch_mma<2>(w, x, nullptr, 0.0f, y, accumulate, stream);
  else
    launch_mma<0>(w, x, nullptr, 0.0f, y, accumulate, stream);
}

}  // namespace tierlm::gpu::device
