// gguf_export's Q4_K block (tools/peer/ggml_q4_k.h) against the format's description: values that the format holds
// exactly come back exactly, every field sits where the description puts it, and other values come back within
// their sub-block's step. (That ggml reads the blocks the same way is checked by llama.cpp itself:
// bench/peer/gguf_check.mjs, results in bench/peer/RESULTS.md.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/kernels/kernel_isa.h"
#include "tools/peer/ggml_q4_k.h"

using namespace tierlm;

namespace {

TEST(GgmlQ4K, ValuesTheFormatHoldsComeBackExactlyAndEachFieldIsWhereTheFormatPutsIt) {
  // Sub-block j: d * sc[j] * q - dmin * mn[j], codes 0..15 each present, the largest scale and minimum 63 (so the
  // quantizer's super-block scales are d and dmin themselves), d and dmin powers of two (exact in f16).
  const float d = 1.0f / 64, dmin = 1.0f / 128;
  const int sc[8] = {63, 5, 17, 40, 0b110101, 1, 33, 62}, mn[8] = {0, 63, 12, 7, 0b101110, 50, 9, 21};
  std::vector<float> x(256);
  std::vector<int> code(256);
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 32; ++i) {
      code[32 * j + i] = (i * 7 + j) % 16;
      x[32 * j + i] = d * float(sc[j]) * float(code[32 * j + i]) - dmin * float(mn[j]);
    }
  uint8_t block[tools::kQ4KBytes];
  tools::quantize_q4_k(x.data(), block);
  uint16_t h;
  std::memcpy(&h, block, 2);
  EXPECT_EQ(kernels::f16_to_f32(h), d);
  std::memcpy(&h, block + 2, 2);
  EXPECT_EQ(kernels::f16_to_f32(h), dmin);
  const uint8_t* packed = block + 4;
  for (int j = 0; j < 4; ++j) {  // 6-bit scales and minimums, the upper four's top bits in bits 6-7
    EXPECT_EQ(packed[j] & 63, sc[j]);
    EXPECT_EQ(packed[j] >> 6, sc[j + 4] >> 4);
    EXPECT_EQ(packed[j + 4] & 63, mn[j]);
    EXPECT_EQ(packed[j + 4] >> 6, mn[j + 4] >> 4);
    EXPECT_EQ(packed[j + 8] & 15, sc[j + 4] & 15);
    EXPECT_EQ(packed[j + 8] >> 4, mn[j + 4] & 15);
  }
  EXPECT_EQ(packed[0], 63 | (0b11 << 6));  // scale 4 = 0b110101: its bits 4-5 (0b11) above scale 0
  EXPECT_EQ(packed[8], 0b0101 | (0b1110 << 4));  // its bits 0-3, and minimum 4's (0b101110) bits 0-3
  const uint8_t* codes = block + 16;
  for (int j = 0; j < 8; ++j)  // sub-blocks 2c and 2c + 1 in the low and high nibbles of bytes 32c .. 32c + 31
    for (int i = 0; i < 32; ++i) {
      const uint8_t byte = codes[32 * (j / 2) + i];
      EXPECT_EQ(j % 2 ? byte >> 4 : byte & 15, code[32 * j + i]) << j << " " << i;
    }
  std::vector<float> y(256);
  tools::dequantize_q4_k(block, y.data());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(GgmlQ4K, OtherValuesComeBackWithinTheirSubBlocksStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(256), y(256);
    const float shift = trial % 3 == 0 ? 0.05f : 0.0f;  // all-positive sub-blocks too (minimum 0)
    for (float& v : x) v = normal(rng) + shift;
    if (trial == 7) std::fill(x.begin(), x.end(), 0.0f);
    uint8_t block[tools::kQ4KBytes];
    tools::quantize_q4_k(x.data(), block);
    tools::dequantize_q4_k(block, y.data());
    for (int j = 0; j < 8; ++j) {
      float lo = 0, hi = x[32 * j];
      for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
      // Half a step from the code, plus the 6-bit rounding of the scale and the minimum (half a grid step of
      // each super-block maximum, over 15 codes for the scale): well under a step in all.
      const float step = (hi - lo) / 15;
      for (int i = 0; i < 32; ++i)
        ASSERT_LE(std::fabs(y[32 * j + i] - x[32 * j + i]), step + 1e-6f) << "trial " << trial << " value " << 32 * j + i;
    }
  }
}

}  // namespace
