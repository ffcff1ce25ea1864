// runtime/model/tensor_convert.h — copying a safetensors tensor out as f32 (from F32, F16 or BF16), bit-exact:
// half and bfloat16 widen to f32 without rounding, so subnormals, infinities, signed zeros and NaN payloads survive.
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

// The tensor's elements as f32. Throws ModelError for dtypes other than F32/F16/BF16.
std::vector<float> tensor_to_f32(const TensorIndex& index, const TensorInfo& tensor);
// Same into caller storage of tensor.elements() floats.
void tensor_to_f32(const TensorIndex& index, const TensorInfo& tensor, float* out);

}  // namespace tierlm::model
