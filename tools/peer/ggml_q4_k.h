// tools/peer/ggml_q4_k.h — ggml's Q4_K block for gguf_export: written from the format's description (a super-block
// of 256 values in 8 sub-blocks of 32; per sub-block a 6-bit scale and a 6-bit minimum, both multiples of the
// super-block's f16 `d` and `dmin`; value = d * scale * q - dmin * min with q a 4-bit code), not from ggml's code.
// Block bytes: d (f16), dmin (f16), 12 bytes of packed 6-bit scales and minimums, 128 bytes of codes. Sub-blocks 2c
// and 2c + 1 share code bytes 32c .. 32c + 31: the low nibbles are sub-block 2c's 32 values, the high ones 2c + 1's.
// Scale/minimum packing: for j < 4, byte j holds scale j in bits 0-5 and bits 4-5 of scale j + 4 in bits 6-7;
// byte j + 4 holds minimum j in bits 0-5 and bits 4-5 of minimum j + 4 in bits 6-7; byte j + 8 holds bits 0-3 of
// scale j + 4 (low nibble) and of minimum j + 4 (high nibble).
//
// The quantizer is a simple one: each sub-block's range [min(0, lowest), highest] over 15 steps, the scales and
// minimums on a 63-step grid of their largest, each sub-block's grid points chosen among the neighbouring ones by
// squared error, codes rounded to the nearest step. llama.cpp's own quantizer searches wider; this one writes the
// same format at about Q4_0's error (bench/peer/RESULTS.md), which is what a speed comparison needs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::tools {

inline constexpr int kQ4KValues = 256;  // values per block
inline constexpr int kQ4KBytes = 144;   // bytes per block
inline constexpr uint32_t kGgmlTypeQ4K = 12;  // ggml_type GGML_TYPE_Q4_K

// 256 values -> one 144-byte block.
inline void quantize_q4_k(const float* x, uint8_t* out) {
  float scale[8], minimum[8];  // per sub-block: the step and the (non-negative) offset subtracted
  float max_scale = 0, max_minimum = 0;
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = x[32 * j];
    for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
    scale[j] = std::max(hi - lo, 0.0f) / 15.0f;
    minimum[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_minimum = std::max(max_minimum, minimum[j]);
  }
  const uint16_t d16 = kernels::f32_to_f16(max_scale / 63.0f), dmin16 = kernels::f32_to_f16(max_minimum / 63.0f);
  const float d = kernels::f16_to_f32(d16), dmin = kernels::f16_to_f32(dmin16);
  // Each sub-block's 6-bit scale and minimum: of the grid points either side of its own (the scale one more above,
  // so the top values need not clip), the pair whose codes reproduce the sub-block with the least squared error.
  auto code_of = [](float v, float offset, float inverse) {
    return int(std::clamp(std::lround((v + offset) * inverse), 0L, 15L));
  };
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    const long s0 = d > 0 ? long(std::floor(scale[j] / d)) : 0, m0 = dmin > 0 ? long(std::floor(minimum[j] / dmin)) : 0;
    double best = -1;
    sc[j] = mn[j] = 0;
    for (long m = m0; m <= m0 + 1; ++m)
      for (long q = s0; q <= s0 + 2; ++q) {
        if (m > 63 || q > 63) continue;
        const float step = d * float(q), offset = dmin * float(m), inverse = step > 0 ? 1.0f / step : 0.0f;
        double error = 0;
        for (int i = 0; i < 32; ++i) {
          const float v = x[32 * j + i];
          const double e = double(step * float(code_of(v, offset, inverse)) - offset - v);
          error += e * e;
        }
        if (best < 0 || error < best) best = error, sc[j] = uint8_t(q), mn[j] = uint8_t(m);
      }
  }
  std::memcpy(out, &d16, 2);
  std::memcpy(out + 2, &dmin16, 2);
  uint8_t* packed = out + 4;
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t(mn[j] | ((mn[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  uint8_t* codes = out + 16;
  std::memset(codes, 0, 128);
  for (int j = 0; j < 8; ++j) {
    const float step = d * float(sc[j]), offset = dmin * float(mn[j]);
    const float inverse = step > 0 ? 1.0f / step : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const int q = code_of(x[32 * j + i], offset, inverse);
      codes[32 * (j / 2) + i] |= uint8_t(j % 2 ? q << 4 : q);
    }
  }
}

// One 144-byte block -> 256 values (the tests' decoder; llama.cpp is the oracle that it agrees with ggml's).
inline void dequantize_q4_k(const uint8_t* in, float* y) {
  uint16_t d16, dmin16;
  std::memcpy(&d16, in, 2);
  std::memcpy(&dmin16, in + 2, 2);
  const float d = kernels::f16_to_f32(d16), dmin = kernels::f16_to_f32(dmin16);
  const uint8_t* packed = in + 4;
  const uint8_t* codes = in + 16;
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? packed[j] & 63 : (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4);
    const int mn = j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    for (int i = 0; i < 32; ++i) {
      const uint8_t byte = codes[32 * (j / 2) + i];
      const int q = j % 2 ? byte >> 4 : byte & 0xF;
      y[32 * j + i] = d * float(sc) * float(q) - dmin * float(mn);
    }
  }
}

}  // namespace tierlm::tools
