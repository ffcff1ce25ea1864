// runtime/kernels/mlx_repack.cpp — MLX words, scales and biases into the panel layout (see mlx_repack.h), with no
// temporaries: a 32-column block of a 4-bit row is 16 source bytes -> 16 panel bytes (SSE2 nibble unpacks, four rows
// at a time so each 64-byte chunk gets 16-byte stores), an 8-bit quad is one source word, and both go panel by panel
// so every 256-byte block is written whole.
#include "runtime/kernels/mlx_repack.h"

#include <emmintrin.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

namespace {

// One 4-bit block of a row: source byte i holds columns 2i (low nibble) and 2i+1; result byte t holds column t (low
// nibble) and column t+16 (high), so its 32-bit word c is the row's 4 bytes of panel chunk c.
inline __m128i block_codes(__m128i v) {
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i even = _mm_and_si128(v, low), odd = _mm_and_si128(_mm_srli_epi16(v, 4), low);
  const __m128i first = _mm_unpacklo_epi8(even, odd), second = _mm_unpackhi_epi8(even, odd);  // columns 0-15, 16-31
  return _mm_or_si128(first, _mm_slli_epi16(second, 4));  // bytes <= 0x0F: the shift stays inside each byte
}

// Scales (or biases) [rows, groups] of rows [row0, row0 + rows) into their panels' lanes: lane r of (panel, group)
// is row p * kPanelRows + r; rows at or past total_rows get 0.
template <class T>
void pack_scales(const void* src, void* dst, int64_t row0, int64_t rows, int64_t total_rows, int64_t groups) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<T*>(dst);
  const int64_t p0 = row0 / kPanelRows, p1 = (row0 + rows + kPanelRows - 1) / kPanelRows;
  for (int64_t p = p0; p < p1; ++p)
    for (int r = 0; r < kPanelRows; ++r) {
      const int64_t row = p * kPanelRows + r;
      T* lanes = d + p * groups * kPanelRows + r;
      if (row >= total_rows) {
        for (int64_t g = 0; g < groups; ++g) lanes[g * kPanelRows] = T{0};
        continue;
      }
      const uint8_t* in = s + size_t((row - row0) * groups) * sizeof(T);
      for (int64_t g = 0; g < groups; ++g) std::memcpy(&lanes[g * kPanelRows], in + size_t(g) * sizeof(T), sizeof(T));
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
    if (bits == 8) {
      for (int r = 0; r < kPanelRows; ++r) {
        const int64_t row = p * kPanelRows + r;
        const uint8_t* in = row < end ? src + (row - t.first_row) * row_bytes : nullptr;
        // Quad k of the panel (4 columns) is the row's word k as stored: code j at bits 8j, i.e. byte j.
        for (int64_t k = 0; k < cols / 4; ++k) {
          uint32_t w = 0;
          if (in) std::memcpy(&w, in + k * 4, 4);
          std::memcpy(panel + k * 64 + r * 4, &w, 4);
        }
      }
      continue;
    }
    // 4-bit: panel chunk c of block b holds, in row r's 4 bytes, columns 32b+4c+j (low nibble) and 32b+16+4c+j (high
    // nibble), j in [0, 4). Four rows' blocks are transposed by 32-bit words, so chunk c of those rows is one store.
    for (int r = 0; r < kPanelRows; r += 4) {
      const uint8_t* in[4];
      for (int q = 0; q < 4; ++q) {
        const int64_t row = p * kPanelRows + r + q;
        in[q] = row < end ? src + (row - t.first_row) * row_bytes : nullptr;
      }
      for (int64_t b = 0; b < cols / 32; ++b) {
        // The source streams from DRAM (a read's staging bytes): each row is only a few cache lines long, too short
        // for the hardware prefetcher, so the next four rows' lines are asked for while these are packed.
        if ((b & 3) == 0)
          for (int q = 0; q < 4; ++q)
            if (in[q])  // an address only (past the source's end for its last rows): a hint never faults
              _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(in[q]) +
                                                         uintptr_t(4 * row_bytes + b * 16)),
                           _MM_HINT_T0);
        __m128i w[4];
        for (int q = 0; q < 4; ++q)
          w[q] = in[q] ? block_codes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in[q] + b * 16)))
                       : _mm_setzero_si128();
        const __m128i a = _mm_unpacklo_epi32(w[0], w[1]), c = _mm_unpacklo_epi32(w[2], w[3]);  // chunks 0, 1
        const __m128i e = _mm_unpackhi_epi32(w[0], w[1]), g = _mm_unpackhi_epi32(w[2], w[3]);  // chunks 2, 3
        uint8_t* block = panel + b * 256 + r * 4;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(block), _mm_unpacklo_epi64(a, c));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(block + 64), _mm_unpackhi_epi64(a, c));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(block + 128), _mm_unpacklo_epi64(e, g));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(block + 192), _mm_unpackhi_epi64(e, g));
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
