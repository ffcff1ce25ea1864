// Oracle: the float8_e4m3fn definition (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities; S.1111.111
// is NaN; largest finite 448) and DeepSeek's block dequantization W[r][c] = q[r][c] * scale_inv[r / 128][c / 128].
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/kernels/fp8.h"

using namespace tierlm;

TEST(Fp8, E4m3ValuesByDefinition) {
  EXPECT_EQ(kernels::f8e4m3_to_f32(0x38), 1.0f);        // 0.0111.000: 2^(7-7)
  EXPECT_EQ(kernels::f8e4m3_to_f32(0x7e), 448.0f);      // 0.1111.110: 1.75 * 2^8, the largest finite
  EXPECT_EQ(kernels::f8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(kernels::f8e4m3_to_f32(0x01), 0x1p-9f);     // smallest subnormal: 1/8 * 2^-6
  EXPECT_EQ(kernels::f8e4m3_to_f32(0x08), 0x1p-6f);     // smallest normal
  EXPECT_EQ(kernels::f8e4m3_to_f32(0x3c), 1.5f);        // 0.0111.100
  EXPECT_TRUE(std::signbit(kernels::f8e4m3_to_f32(0x80)));
  EXPECT_EQ(kernels::f8e4m3_to_f32(0x80), 0.0f);
  EXPECT_TRUE(std::isnan(kernels::f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(kernels::f8e4m3_to_f32(0xff)));
  // Every other positive code is finite and the codes are ordered like the values they encode.
  for (int b = 1; b < 0x7f; ++b)
    EXPECT_LT(kernels::f8e4m3_to_f32(uint8_t(b - 1)), kernels::f8e4m3_to_f32(uint8_t(b)));
}

TEST(Fp8, BlockScalesFollowTheirTiles) {
  // 130 x 260: a 2 x 3 grid of scales, the last row and column of tiles partial.
  const int64_t rows = 130, cols = 260;
  std::vector<uint8_t> q(size_t(rows * cols), 0x38);  // every value 1.0
  const float scales[6] = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(q.size());
  kernels::dequantize_fp8_blocks(q.data(), scales, rows, cols, out.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(out[size_t(r * cols + c)], scales[(r / 128) * 3 + c / 128]) << r << "," << c;
}
