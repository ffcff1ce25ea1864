#include "runtime/kernels/fp8.h"

#include <cmath>
#include <limits>

namespace tierlm::kernels {

float f8e4m3_to_f32(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(float(mantissa), -9);  // subnormal: m/8 * 2^-6
  return sign * std::ldexp(float(8 + mantissa), exponent - 7 - 3);   // (1 + m/8) * 2^(e - 7)
}

void dequantize_fp8_blocks(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t cols, float* out) {
  const int64_t scale_cols = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t r = 0; r < rows; ++r) {
    const float* scales = scale_inv + (r / kFp8Block) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = f8e4m3_to_f32(q[r * cols + c]) * scales[c / kFp8Block];
  }
}

}  // namespace tierlm::kernels
