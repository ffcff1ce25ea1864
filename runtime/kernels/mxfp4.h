// runtime/kernels/mxfp4.h — internal: the MXFP4 weight format as OpenAI's gpt-oss checkpoints store it, kept packed
// (4.25 bits per weight, never widened in memory). A [rows x cols] matrix (rows = output features) is
//   data   rows x cols/32 blocks of 16 bytes: byte j of block g holds element 32g + 2j in its low nibble and
//          32g + 2j + 1 in its high nibble, each an E2M1 code (bit 3 sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6);
//   scales rows x cols/32 bytes, E8M0: the block's values are multiplied by 2^(scale - 127).
// Exactly transformers' convert_moe_packed_tensors (integrations/mxfp4.py), so the weights equal its dequantized ones.
// The kernels multiply by f32 activations in f32 (no activation quantization): the result differs from an f32 matmul
// over the dequantized weights only by summation order.
// Owns: the scalar reference and the AVX-512 row kernel, reached through weights.cpp's matvec / matmul /
// dequantize_row. Never: allocate in the row kernels, log.
#pragma once

#include <bit>
#include <cstdint>

namespace tierlm::kernels {

inline constexpr int kMxfp4Block = 32;        // values per scale
inline constexpr int kMxfp4BlockBytes = 16;   // bytes of codes per block

// The E2M1 code table (transformers' FP4_VALUES).
inline constexpr float kE2M1[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(scale - 127) as a float: scale 0 is the denormal 2^-127, 255 (E8M0's NaN) becomes inf as torch.ldexp makes it.
inline float e8m0_value(uint8_t scale) {
  const uint32_t bits = scale == 0 ? 0x00400000u : scale == 255 ? 0x7F800000u : uint32_t(scale) << 23;
  return std::bit_cast<float>(bits);
}

// One row (cols/32 blocks) dequantized into out[cols], in natural order.
void mxfp4_dequantize_row(const uint8_t* blocks, const uint8_t* scales, int64_t cols, float* out);

// The dot products of rows [r0, r1) with n activation rows (x: n x cols, row-major), y[t * y_stride + r].
// Scalar reference: block by block, in natural order.
void mxfp4_rows_scalar(const uint8_t* blocks, const uint8_t* scales, int64_t cols, int64_t r0, int64_t r1,
                       const float* x, int64_t n, float* y, int64_t y_stride);
// AVX-512 (only on CPUs that have it): the same sums, 16 lanes at a time, over activations split per block into
// [16 even | 16 odd] inputs by mxfp4_split_activations (once per call, not per weight row).
void mxfp4_rows_avx512(const uint8_t* blocks, const uint8_t* scales, int64_t cols, int64_t r0, int64_t r1,
                       const float* x_split, int64_t n, float* y, int64_t y_stride);
void mxfp4_split_activations(const float* x, int64_t n, int64_t cols, float* out);

}  // namespace tierlm::kernels
