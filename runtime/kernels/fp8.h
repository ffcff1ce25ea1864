// runtime/kernels/fp8.h — DeepSeek's FP8 block format as stored: float8_e4m3fn values with one f32 weight_scale_inv
// per 128x128 block ([ceil(rows/128), ceil(cols/128)]); W[r][c] = float(q[r][c]) * scale_inv[r / 128][c / 128], one f32
// rounding, as the checkpoint's README and transformers' Fp8Dequantize define it. Used at load (dense matrices) and
// at an expert miss (the expert tier), both converting to a kernel format.
// Never: allocate or log.
#pragma once

#include <cstdint>

namespace tierlm::kernels {

inline constexpr int64_t kFp8Block = 128;

// float8_e4m3fn bits -> f32 (exact; no infinities, 0x7f / 0xff are NaN).
float f8e4m3_to_f32(uint8_t bits);
// q (rows x cols e4m3 bytes) times its block scales (ceil(rows/128) x ceil(cols/128) floats) into out.
void dequantize_fp8_blocks(const uint8_t* q, const float* scale_inv, int64_t rows, int64_t cols, float* out);

}  // namespace tierlm::kernels
