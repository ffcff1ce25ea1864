// runtime/model/tensor_convert.cpp — widening F16/BF16/F32 tensor bytes to f32.
#include "runtime/model/tensor_convert.h"

#include <bit>
#include <cstring>
#include <string>

namespace tierlm::model {

float f16_bits_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload kept
  } else if (exponent != 0) {
    out = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;  // signed zero
  } else {
    // Subnormal half m * 2^-24: normalise so the leading 1 becomes the implicit bit of a normal float.
    const int lead = 31 - std::countl_zero(mantissa);  // 0..9
    mantissa = (mantissa << (10 - lead)) & 0x3ffu;
    out = sign | (static_cast<uint32_t>(lead + 127 - 24) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(out);
}

float bf16_bits_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

namespace {

// Data may sit at any byte offset in the file, so loads go through memcpy (the compiler makes them plain loads).
template <typename Convert>
void widen_u16(const std::byte* in, size_t n, float* out, Convert convert) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, in + 2 * i, 2);
    out[i] = convert(bits);
  }
}

void require_float_dtype(const TensorInfo& tensor) {
  if (tensor.dtype != DType::F32 && tensor.dtype != DType::F16 && tensor.dtype != DType::BF16)
    throw ModelError("tensor '" + tensor.name + "' in '" + tensor.file + "' has dtype " + dtype_name(tensor.dtype) +
                     "; only F32, F16 and BF16 convert to f32");
}

}  // namespace

void tensor_to_f32(const TensorIndex& index, const TensorInfo& tensor, float* out) {
  require_float_dtype(tensor);
  const auto bytes = index.data(tensor);
  const size_t n = static_cast<size_t>(tensor.elements());
  if (bytes.size() != n * dtype_size(tensor.dtype))
    throw ModelError("tensor '" + tensor.name + "' in '" + tensor.file + "': " + std::to_string(bytes.size()) +
                     " bytes do not hold " + std::to_string(n) + " elements of " + dtype_name(tensor.dtype));
  if (n == 0) return;
  switch (tensor.dtype) {
    case DType::F32:
      std::memcpy(out, bytes.data(), n * sizeof(float));
      break;
    case DType::F16:
      widen_u16(bytes.data(), n, out, f16_bits_to_f32);
      break;
    default:
      widen_u16(bytes.data(), n, out, bf16_bits_to_f32);
      break;
  }
}

std::vector<float> tensor_to_f32(const TensorIndex& index, const TensorInfo& tensor) {
  require_float_dtype(tensor);  // before allocating: a huge non-float tensor should fail fast
  std::vector<float> out(static_cast<size_t>(tensor.elements()));
  tensor_to_f32(index, tensor, out.data());
  return out;
}

}  // namespace tierlm::model
