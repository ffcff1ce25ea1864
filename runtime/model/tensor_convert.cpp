// runtime/model/tensor_convert.cpp — widening F16/BF16/F32 tensor bytes to f32; dequantizing FP8 block tensors.
#include "runtime/model/tensor_convert.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "runtime/kernels/fp8.h"

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
  if (tensor.dtype != DType::F32 && tensor.dtype != DType::F16 && tensor.dtype != DType::BF16 &&
      tensor.dtype != DType::F8_E4M3)
    throw ModelError("tensor '" + tensor.name + "' in '" + tensor.file + "' has dtype " + dtype_name(tensor.dtype) +
                     "; only F32, F16, BF16 and block-scaled F8_E4M3 convert to f32");
}

// An FP8 matrix: its scale_inv sibling, of the block grid's shape, in F32.
void fp8_to_f32(const TensorIndex& index, const TensorInfo& tensor, const std::byte* bytes, float* out) {
  const std::string scale_name = tensor.name + "_scale_inv";
  if (tensor.shape.size() != 2 || !index.contains(scale_name))
    throw ModelError(fmt::format("tensor '{}' in '{}' is F8_E4M3 but has no 2-D block scale '{}' (only DeepSeek's "
                                 "128x128 block FP8 is supported)", tensor.name, tensor.file, scale_name));
  const TensorInfo& scale = index.at(scale_name);
  const int64_t rows = tensor.shape[0], cols = tensor.shape[1];
  const int64_t block = kernels::kFp8Block;
  const std::vector<int64_t> grid = {(rows + block - 1) / block, (cols + block - 1) / block};
  if (scale.dtype != DType::F32 || scale.shape != grid)
    throw ModelError(fmt::format("tensor '{}' must be F32 [{}, {}] (128x128 blocks of '{}')", scale_name, grid[0],
                                 grid[1], tensor.name));
  std::vector<float> scales(size_t(grid[0] * grid[1]));
  std::memcpy(scales.data(), index.data(scale).data(), scales.size() * sizeof(float));
  kernels::dequantize_fp8_blocks(reinterpret_cast<const uint8_t*>(bytes), scales.data(), rows, cols, out);
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
    case DType::F8_E4M3:
      fp8_to_f32(index, tensor, bytes.data(), out);
      break;
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
