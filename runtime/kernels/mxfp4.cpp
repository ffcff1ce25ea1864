// runtime/kernels/mxfp4.cpp — the MXFP4 scalar reference (see mxfp4.h).
#include "runtime/kernels/mxfp4.h"

namespace tierlm::kernels {

void mxfp4_dequantize_row(const uint8_t* blocks, const uint8_t* scales, int64_t cols, float* out) {
  for (int64_t g = 0; g < cols / kMxfp4Block; ++g) {
    const float s = e8m0_value(scales[g]);
    const uint8_t* b = blocks + g * kMxfp4BlockBytes;
    for (int j = 0; j < kMxfp4BlockBytes; ++j) {
      out[g * kMxfp4Block + 2 * j] = kE2M1[b[j] & 0x0F] * s;
      out[g * kMxfp4Block + 2 * j + 1] = kE2M1[b[j] >> 4] * s;
    }
  }
}

void mxfp4_rows_scalar(const uint8_t* blocks, const uint8_t* scales, int64_t cols, int64_t r0, int64_t r1,
                       const float* x, int64_t n, float* y, int64_t y_stride) {
  const int64_t groups = cols / kMxfp4Block;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = blocks + r * groups * kMxfp4BlockBytes;
    const uint8_t* row_scales = scales + r * groups;
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * cols;
      float sum = 0;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* b = row + g * kMxfp4BlockBytes;
        const float* xg = xt + g * kMxfp4Block;
        float block = 0;
        for (int j = 0; j < kMxfp4BlockBytes; ++j)
          block += kE2M1[b[j] & 0x0F] * xg[2 * j] + kE2M1[b[j] >> 4] * xg[2 * j + 1];
        sum += block * e8m0_value(row_scales[g]);
      }
      y[t * y_stride + r] = sum;
    }
  }
}

void mxfp4_split_activations(const float* x, int64_t n, int64_t cols, float* out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < cols / kMxfp4Block; ++g) {
      const float* in = x + t * cols + g * kMxfp4Block;
      float* o = out + t * cols + g * kMxfp4Block;
      for (int j = 0; j < kMxfp4Block / 2; ++j) {
        o[j] = in[2 * j];
        o[kMxfp4Block / 2 + j] = in[2 * j + 1];
      }
    }
}

}  // namespace tierlm::kernels
