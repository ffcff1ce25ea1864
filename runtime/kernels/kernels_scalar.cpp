// runtime/kernels/kernels_scalar.cpp — the portable reference kernels. They define the exact math every SIMD
// backend must reproduce (within float rounding) and are the oracle the tests compare the others against.
#include <algorithm>
#include <cmath>

#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/packed_codes.h"

namespace tierlm::kernels {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3FFu) << 13;
    }
  } else if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u);  // inf / nan
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504: overflow to inf
  if (abs < 0x38800000u) {                          // result is subnormal (or zero) in f16
    if (abs < 0x33000000u) return sign;            // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24 relative to the f16 subnormal grid
    uint32_t half = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

void quantize_row_scalar(const float* x, int64_t cols, int8_t* q, float* dx, int32_t* isum, float* xsum) {
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    const float* xb = x + b * kActBlock;
    float amax = 0.0f;
    for (int j = 0; j < kActBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float scale = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < kActBlock; ++j) {
      const int v = static_cast<int>(std::nearbyint(xb[j] * inv));
      q[b * kActBlock + j] = static_cast<int8_t>(v);
      sum += v;
    }
    dx[b] = scale;
    isum[b] = sum;
    xsum[b] = scale * static_cast<float>(sum);
  }
}

void packed_matmul_scalar(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                          int64_t p1) {
  const int64_t blocks = w.cols / kActBlock;
  const int blocks_per_group = w.group / kActBlock;
  for (int64_t p = p0; p < p1; ++p) {
    for (int r = 0; r < kPanelRows; ++r) {
      const int64_t row = p * kPanelRows + r;
      if (row >= w.rows) break;
      for (int64_t i = 0; i < n; ++i) {
        float acc_y = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t g = b / blocks_per_group;
          const int64_t scale_index = (p * w.groups() + g) * kPanelRows + r;
          const float d = load_scale(w.d, w.scale_type, scale_index);
          int32_t acc = 0;
          for (int j = 0; j < kActBlock; ++j) {
            const int64_t col = b * kActBlock + j;
            acc += static_cast<int32_t>(packed_code(w, p, r, col)) * x[i].q[col];
          }
          if (w.symmetric()) {
            acc_y += d * x[i].dx[b] * static_cast<float>(acc - 128 * x[i].isum[b]);
          } else {
            const float m = load_scale(w.m, w.scale_type, scale_index);
            acc_y += d * x[i].dx[b] * static_cast<float>(acc);
            acc_y += m * x[i].xsum[b];
          }
        }
        y[i * ldy + row] = acc_y;
      }
    }
  }
}

void packed_matvec_scalar(const PackedView& w, const QuantizedRow& x, float* y, int64_t p0, int64_t p1) {
  packed_matmul_scalar(w, &x, 1, y, 0, p0, p1);
}

float dense_element(WeightFormat f, const void* w, int64_t i) {
  switch (f) {
    case WeightFormat::f16: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
    case WeightFormat::bf16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    default: return static_cast<const float*>(w)[i];
  }
}

void dense_matvec_scalar(WeightFormat f, const void* w, int64_t cols, const float* x, float* y, int64_t r0,
                         int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(dense_element(f, w, r * cols + c)) * x[c];
    y[r] = static_cast<float>(acc);
  }
}

void dense_to_f32_scalar(WeightFormat f, const void* w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  for (int64_t i = r0 * cols; i < r1 * cols; ++i) out[i - r0 * cols] = dense_element(f, w, i);
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{quantize_row_scalar, packed_matvec_scalar, packed_matmul_scalar, dense_matvec_scalar,
                                 dense_to_f32_scalar, nullptr};
  return table;
}

}  // namespace tierlm::kernels
