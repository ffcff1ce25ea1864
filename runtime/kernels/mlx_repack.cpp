// runtime/kernels/mlx_repack.cpp — MLX words, scales and biases into the panel layout (see mlx_repack.h), with no
// temporaries: a 32-column block of a 4-bit row is 16 source bytes -> 16 panel bytes through 64-bit nibble spreads,
// an 8-bit quad is one source word, and both go panel by panel so every 256-byte block is written whole.
#include "runtime/kernels/mlx_repack.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

namespace {

uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Byte i of the result = nibble i of x (i in [0, 8)).
uint64_t spread_nibbles(uint32_t x) {
  uint64_t v = x;
  v = (v | (v << 16)) & 0x0000FFFF0000FFFFull;
  v = (v | (v << 8)) & 0x00FF00FF00FF00FFull;
  v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0Full;
  return v;
}

template <class T>
void pack_scales(const void* src, void* dst, int64_t row0, int64_t rows, int64_t total_rows, int64_t groups) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<T*>(dst);
  const int64_t p0 = row0 / kPanelRows, p1 = (row0 + rows + kPanelRows - 1) / kPanelRows;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t g = 0; g < groups; ++g) {
      T* lanes = d + (p * groups + g) * kPanelRows;
      for (int r = 0; r < kPanelRows; ++r) {
        const int64_t row = p * kPanelRows + r;
        if (row >= total_rows) {
          lanes[r] = T{0};
          continue;
        }
        std::memcpy(&lanes[r], s + size_t((row - row0) * groups + g) * sizeof(T), sizeof(T));
      }
    }
}

}  // namespace

void pack_mlx_rows(const void* words, const void* scales, const void* biases, SourceType scale_type, int64_t rows,
                   int64_t cols, int group_size, int bits, const MlxPackTarget& t) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("pack_mlx_rows: bits must be 4 or 8");
  if (rows <= 0 || cols <= 0 || group_size <= 0 || cols % group_size != 0 || cols % 32 != 0)
    throw std::invalid_argument("pack_mlx_rows: cols (" + std::to_string(cols) +
                                ") must be a multiple of the group size and of 32");
  const int64_t end = t.first_row + rows;
  if (t.first_row < 0 || t.first_row % kPanelRows != 0 || end > t.total_rows ||
      (end % kPanelRows != 0 && end != t.total_rows))
    throw std::invalid_argument("pack_mlx_rows: rows must start on a panel and end on one or at the last row");
  if (!words || !scales || !biases || !t.data || !t.scales || !t.biases)
    throw std::invalid_argument("pack_mlx_rows: every source and target must be given");

  const auto* src = static_cast<const uint8_t*>(words);
  auto* data = static_cast<uint8_t*>(t.data);
  const int64_t row_bytes = cols * bits / 8, panel_bytes = cols * kPanelRows * bits / 8;
  const int64_t p0 = t.first_row / kPanelRows, p1 = (end + kPanelRows - 1) / kPanelRows;
  for (int64_t p = p0; p < p1; ++p) {
    uint8_t* panel = data + p * panel_bytes;
    for (int r = 0; r < kPanelRows; ++r) {
      const int64_t row = p * kPanelRows + r;
      const uint8_t* in = row < end ? src + (row - t.first_row) * row_bytes : nullptr;
      if (bits == 8) {
        // Quad k of the panel (4 columns) is the row's word k as stored: code j at bits 8j, i.e. byte j.
        for (int64_t k = 0; k < cols / 4; ++k) {
          uint32_t w = 0;
          if (in) std::memcpy(&w, in + k * 4, 4);
          std::memcpy(panel + k * 64 + r * 4, &w, 4);
        }
        continue;
      }
      // 4-bit: source byte i holds columns 2i (low nibble) and 2i+1; panel chunk c of block b holds, in row r's 4
      // bytes, columns 32b+4c+j (low nibble) and 32b+16+4c+j (high nibble), j in [0, 4).
      for (int64_t b = 0; b < cols / 32; ++b) {
        uint64_t lo = 0, hi = 0;
        if (in) {
          const uint64_t first = load64(in + b * 16), second = load64(in + b * 16 + 8);
          lo = spread_nibbles(uint32_t(first)) | (spread_nibbles(uint32_t(second)) << 4);
          hi = spread_nibbles(uint32_t(first >> 32)) | (spread_nibbles(uint32_t(second >> 32)) << 4);
        }
        uint8_t* block = panel + b * 256 + r * 4;
        const uint32_t chunks[4] = {uint32_t(lo), uint32_t(lo >> 32), uint32_t(hi), uint32_t(hi >> 32)};
        for (int c = 0; c < 4; ++c) std::memcpy(block + c * 64, &chunks[c], 4);
      }
    }
  }
  const int64_t groups = cols / group_size;
  if (scale_type == SourceType::f32) {
    pack_scales<uint32_t>(scales, t.scales, t.first_row, rows, t.total_rows, groups);
    pack_scales<uint32_t>(biases, t.biases, t.first_row, rows, t.total_rows, groups);
  } else {
    pack_scales<uint16_t>(scales, t.scales, t.first_row, rows, t.total_rows, groups);
    pack_scales<uint16_t>(biases, t.biases, t.first_row, rows, t.total_rows, groups);
  }
}

}  // namespace tierlm::kernels
