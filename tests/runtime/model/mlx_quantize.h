// tests/runtime/model/mlx_quantize.h — MLX affine quantization for tests that write mlx-community folders: per row,
// groups of `group` columns as scale * q + bias (scale = (max - min) / (2^bits - 1), bias = min), q packed `bits`
// at a time into uint32 words from the low bits, as mx.quantize stores them; f32 scales and biases, so the
// dequantized values are exactly what a loader must compute from the folder. Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tierlm::test {

struct MlxQuantized {
  std::vector<uint32_t> packed;
  std::vector<float> scales, biases, dequantized;
};

// rows x cols values (row-major), `bits` (4 or 8) per value.
inline MlxQuantized mlx_quantize(const std::vector<float>& w, int64_t rows, int64_t cols, int bits, int group) {
  MlxQuantized q;
  const int per_word = 32 / bits, levels = (1 << bits) - 1;
  q.packed.assign(size_t(rows * cols / per_word), 0);
  q.dequantized.resize(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / group; ++g) {
      const float* x = &w[size_t(r * cols + g * group)];
      const float lo = *std::min_element(x, x + group), hi = *std::max_element(x, x + group);
      const float scale = std::max((hi - lo) / float(levels), 1e-8f), bias = lo;
      q.scales.push_back(scale);
      q.biases.push_back(bias);
      for (int j = 0; j < group; ++j) {
        const int64_t c = g * group + j;
        const uint32_t code = uint32_t(std::clamp(std::lround((x[j] - bias) / scale), 0L, long(levels)));
        q.packed[size_t((r * cols + c) / per_word)] |= code << (bits * (c % per_word));
        q.dequantized[size_t(r * cols + c)] = float(code) * scale + bias;
      }
    }
  return q;
}

}  // namespace tierlm::test
