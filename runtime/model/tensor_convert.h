// runtime/model/tensor_convert.h — copying a safetensors tensor out as f32 (from F32, F16 or BF16), bit-exact:
// half and bfloat16 widen to f32 without rounding, so subnormals, infinities, signed zeros and NaN payloads survive.
// FP8 block-quantized weights (DeepSeek: F8_E4M3 `W` beside F32 `W_scale_inv` [ceil(rows/128), ceil(cols/128)]) come
// out dequantized as the checkpoint defines them: float(q) * scale_inv[r / 128][c / 128], one f32 rounding, which is
// what transformers' Fp8Dequantize computes.
// Owns: the scalar conversions. Never: convert other dtypes silently (they throw ModelError naming the tensor).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/safetensors.h"

namespace tierlm::model {

// IEEE binary16 bits -> f32 (exact; every half is representable as a float).
float f16_bits_to_f32(uint16_t bits);
// bfloat16 bits -> f32 (exact: bfloat16 is the top half of an f32).
float bf16_bits_to_f32(uint16_t bits);

// The tensor's elements as f32 (an F8_E4M3 matrix through its NAME_scale_inv sibling). Throws ModelError for other
// dtypes, and for an FP8 tensor without a scale of the block shape.
std::vector<float> tensor_to_f32(const TensorIndex& index, const TensorInfo& tensor);
// Same into caller storage of tensor.elements() floats.
void tensor_to_f32(const TensorIndex& index, const TensorInfo& tensor, float* out);

}  // namespace tierlm::model
