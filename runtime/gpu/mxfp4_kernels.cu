// runtime/gpu/mxfp4_kernels.cu — the matrix-vector product of MXFP4 weights (gpt-oss's experts) read packed from
// VRAM, as runtime/kernels/mxfp4.h stores them: a row is cols/32 blocks of 16 code bytes (element 2j in the low
// nibble of byte j, 2j + 1 in the high one, E2M1) with one E8M0 scale byte per block. Decode and prefill both come
// here (no f16 dequantization: the activations stay f32, as on the CPU).
// One warp per weight row: lane g takes blocks g, g + 32, ... (one 16-byte load and one scale byte each), sums
// code * x over the block in the CPU's order, times the scale, then the lanes' sums are added by shuffles; up to
// kRowsPerPass activation rows share each block load. Never: widen the weights in memory.
#include <cuda_fp16.h>

#include "runtime/gpu/device_kernels.cuh"
#include "runtime/gpu/device_launch.cuh"

namespace tierlm::gpu::device {

using namespace detail;

namespace {

__constant__ float kE2M1Codes[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(scale - 127) (kernels::e8m0_value: 0 is the denormal 2^-127, 255 becomes inf).
__device__ __forceinline__ float e8m0(uint32_t scale) {
  const uint32_t bits = scale == 0 ? 0x00400000u : scale == 255 ? 0x7F800000u : scale << 23;
  return __uint_as_float(bits);
}

constexpr int kWarps = 8;        // weight rows per block
constexpr int kRowsPerPass = 4;  // activation rows per block load

__global__ void __launch_bounds__(kWarps * 32) mxfp4_matvec_kernel(const uint8_t* blocks, const uint8_t* scales,
                                                                    int64_t rows, int64_t cols, const float* x,
                                                                    int64_t ldx, int64_t n, float* y, int64_t ldy,
                                                                    bool accumulate) {
  kernel_entry();
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int64_t groups = cols / 32;
  const uint8_t* row = blocks + r * groups * 16;
  const uint8_t* row_scales = scales + r * groups;
  for (int64_t t0 = 0; t0 < n; t0 += kRowsPerPass) {
    const int live = int(min(int64_t(kRowsPerPass), n - t0));
    float sum[kRowsPerPass] = {};
    for (int64_t g = lane; g < groups; g += 32) {
      const uint4 word = *reinterpret_cast<const uint4*>(row + g * 16);
      const float s = e8m0(row_scales[g]);
      const uint32_t w[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
      for (int t = 0; t < kRowsPerPass; ++t) {
        if (t >= live) break;
        const float* xg = x + (t0 + t) * ldx + g * 32;
        float block = 0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const uint32_t byte = (w[j / 4] >> (8 * (j % 4))) & 0xffu;
          block += kE2M1Codes[byte & 0x0fu] * xg[2 * j] + kE2M1Codes[byte >> 4] * xg[2 * j + 1];
        }
        sum[t] += block * s;
      }
    }
#pragma unroll
    for (int t = 0; t < kRowsPerPass; ++t) {
      float v = sum[t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (t < live && lane == 0) {
        float* out = y + (t0 + t) * ldy + r;
        *out = accumulate ? *out + v : v;
      }
    }
  }
}

}  // namespace

void mxfp4_matvec(const MatrixRef& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy, bool accumulate,
                  cudaStream_t stream) {
  if (n <= 0 || w.rows <= 0) return;
  launch(mxfp4_matvec_kernel, unsigned((w.rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream,
         static_cast<const uint8_t*>(w.data), static_cast<const uint8_t*>(w.scales), w.rows, w.cols, x, ldx, n, y,
         ldy, accumulate);
}

}  // namespace tierlm::gpu::device
