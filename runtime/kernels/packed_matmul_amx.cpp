// runtime/kernels/packed_matmul_amx.cpp — the prefill GEMM of packed weights (q8_0, q4 and the MLX packs taken with
// int8 activations) on AMX bf16 tiles (Sapphire Rapids and later: AMX-TILE, AMX-BF16, AVX512-BF16). Compiled with
// AVX-512 and AMX flags; reached only from matmul() when amx_enabled() (kernel_dispatch.cpp).
//
// The int8 path (kernels_avx512.cpp) multiplies codes by int8 activations and scales every 32-column block's
// integer sums, which ties it to one vpdpbusd a cycle. Here a panel's block of codes is dequantized once (the
// format's own arithmetic in f32: d * (u - 128), or d * u + m) and rounded to bf16, the activations are bf16 copies of
// the f32 rows (matmul converts them once per call), and TDPBF16PS accumulates in f32 over the whole row, so no
// per-block scaling is left: a block costs one dequantization (shared by up to 96 activation rows) and one tile
// product per 16 rows. Precision: bf16 keeps 8 significant bits of each weight and activation (the int8 path keeps
// the codes exactly and 7-8 bits of each activation relative to its block's largest).
//
// Tiles: 0-5 the sums of up to 6 x 16 activation rows (f32, 16 x 16 each), 6 the activations (16 rows x 32 bf16),
// 7 the block's weights (16 pairs of columns x 16 panel rows x 2 bf16: AMX's pair-interleaved B layout).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (see kernels_avx512.cpp)
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

constexpr int kSumTiles = 6;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(TileConfig) == 64);

// GCC's tile intrinsics paste their register number into the instruction text, so it must be a literal: these
// pick one by a (constant-folded) switch.
inline void zero_sums(int t) {
  switch (t) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    case 3: _tile_zero(3); break;
    case 4: _tile_zero(4); break;
    default: _tile_zero(5); break;
  }
}
inline void add_products(int t) {  // sums t += activations (6) x weights (7)
  switch (t) {
    case 0: _tile_dpbf16ps(0, 6, 7); break;
    case 1: _tile_dpbf16ps(1, 6, 7); break;
    case 2: _tile_dpbf16ps(2, 6, 7); break;
    case 3: _tile_dpbf16ps(3, 6, 7); break;
    case 4: _tile_dpbf16ps(4, 6, 7); break;
    default: _tile_dpbf16ps(5, 6, 7); break;
  }
}
inline void store_sums(int t, float* out, int64_t stride_bytes) {
  switch (t) {
    case 0: _tile_stored(0, out, stride_bytes); break;
    case 1: _tile_stored(1, out, stride_bytes); break;
    case 2: _tile_stored(2, out, stride_bytes); break;
    case 3: _tile_stored(3, out, stride_bytes); break;
    case 4: _tile_stored(4, out, stride_bytes); break;
    default: _tile_stored(5, out, stride_bytes); break;
  }
}

// The B tile of block b of panel p: 32 columns as 16 column pairs, each pair row holding the 16 panel rows' two
// bf16 values. d4 / m4: the group's scales spread to the 4 codes a row has in a quad (rows 4j..4j+3 in vector j).
template <int Bits>
inline void weights_block(const PackedView& w, int64_t p, int64_t b, const __m512 (&d4)[4], const __m512 (&m4)[4],
                          uint16_t* out) {
  const uint8_t* panel = w.data + p * w.panel_bytes();
  const bool symmetric = w.symmetric();
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int q = 0; q < 8; ++q) {  // quad q: columns 4q..4q+3 of the block, row r's four codes at bytes 4r..4r+3
    __m512i codes;
    if constexpr (Bits == 8) {
      codes = _mm512_loadu_si512(panel + b * 8 * 64 + q * 64);
    } else {  // chunk c holds quad c in the low nibbles and quad c + 4 in the high ones
      const __m512i v = _mm512_loadu_si512(panel + b * 256 + (q % 4) * 64);
      codes = _mm512_and_si512(q < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
    }
    // Rows 4j..4j+3 (the lane index must be an immediate, also where the loop below is not unrolled).
    const __m128i rows4[4] = {_mm512_extracti32x4_epi32(codes, 0), _mm512_extracti32x4_epi32(codes, 1),
                              _mm512_extracti32x4_epi32(codes, 2), _mm512_extracti32x4_epi32(codes, 3)};
    __m512 f[4];
    for (int j = 0; j < 4; ++j) {
      const __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(rows4[j]));
      f[j] = symmetric ? _mm512_mul_ps(d4[j], _mm512_sub_ps(u, _mm512_set1_ps(128.0f)))
                       : _mm512_fmadd_ps(d4[j], u, m4[j]);
    }
    // bf16 of rows 0-7 and 8-15; 32-bit element i of each = row i / 2's column pair i % 2.
    const __m512i lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f[1], f[0]));
    const __m512i hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(f[3], f[2]));
    _mm512_store_si512(out + (2 * q) * 32, _mm512_permutex2var_epi32(lo, even, hi));
    _mm512_store_si512(out + (2 * q + 1) * 32, _mm512_permutex2var_epi32(lo, odd, hi));
  }
}

// NT (1..6) tiles of 16 activation rows, from row r0, against panel p.
template <int Bits, SourceType ST, int NT>
void panel_rows(const PackedView& w, int64_t p, const uint16_t* xb, int64_t n, int64_t r0, float* y, int64_t ldy) {
  const int64_t groups = w.groups(), blocks = w.cols / kActBlock;
  const int blocks_per_group = w.group / kActBlock;
  const int64_t xstride = w.cols * 2;  // bytes a bf16 activation row
  alignas(64) uint16_t bt[2][16 * 32];  // the B tile, alternating between blocks
  for (int t = 0; t < NT; ++t) zero_sums(t);
  __m512 d4[4], m4[4];
  for (int64_t b = 0; b < blocks; ++b) {
    if (b % blocks_per_group == 0) {
      const int64_t si = (p * groups + b / blocks_per_group) * kPanelRows;
      const __m512 d = load_scales16<ST>(w.d, si);
      const __m512 m = w.symmetric() ? _mm512_setzero_ps() : load_scales16<ST>(w.m, si);
      for (int j = 0; j < 4; ++j) {  // element e of vector j: row 4j + e / 4
        const __m512i rows = _mm512_add_epi32(_mm512_set1_epi32(4 * j),
                                              _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                                  12, 13, 14, 15), 2));
        d4[j] = _mm512_permutexvar_ps(rows, d);
        m4[j] = _mm512_permutexvar_ps(rows, m);
      }
    }
    uint16_t* tile = bt[b & 1];
    weights_block<Bits>(w, p, b, d4, m4, tile);
    _tile_loadd(7, tile, 64);
    const uint16_t* xa = xb + r0 * w.cols + b * kActBlock;
    for (int t = 0; t < NT; ++t) {
      _tile_loadd(6, xa + t * 16 * w.cols, xstride);
      add_products(t);
    }
  }
  const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, w.rows - p * kPanelRows));
  alignas(64) float sums[16 * 16];
  for (int t = 0; t < NT; ++t) {
    const int64_t row0 = r0 + t * 16;
    const int rows = static_cast<int>(std::min<int64_t>(16, n - row0));
    if (valid == kPanelRows && rows == 16) {
      store_sums(t, y + row0 * ldy + p * kPanelRows, ldy * 4);
      continue;
    }
    store_sums(t, sums, 64);  // a partial panel or the last rows: only what exists is written
    for (int i = 0; i < rows; ++i)
      _mm512_mask_storeu_ps(y + (row0 + i) * ldy + p * kPanelRows, static_cast<__mmask16>((1u << valid) - 1),
                            _mm512_load_ps(sums + i * 16));
  }
}

// Activation rows in chunks of up to 6 tiles, each chunk against every panel of the range while its bf16 rows stay
// in L2 (a chunk holds at most ~1 MiB of them: fewer tiles on wide rows); the panel's blocks are dequantized once a
// chunk.
template <int Bits, SourceType ST>
void panels(const PackedView& w, const uint16_t* xb, int64_t n, float* y, int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t tiles = (n + 15) / 16;
  const int64_t chunk = std::clamp<int64_t>((int64_t(1) << 20) / (16 * w.cols * 2), 1, kSumTiles);
  for (int64_t t = 0; t < tiles; t += chunk)
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = t * 16;
      switch (std::min<int64_t>(chunk, tiles - t)) {
        case 1: panel_rows<Bits, ST, 1>(w, p, xb, n, r0, y, ldy); break;
        case 2: panel_rows<Bits, ST, 2>(w, p, xb, n, r0, y, ldy); break;
        case 3: panel_rows<Bits, ST, 3>(w, p, xb, n, r0, y, ldy); break;
        case 4: panel_rows<Bits, ST, 4>(w, p, xb, n, r0, y, ldy); break;
        case 5: panel_rows<Bits, ST, 5>(w, p, xb, n, r0, y, ldy); break;
        default: panel_rows<Bits, ST, 6>(w, p, xb, n, r0, y, ldy); break;
      }
    }
}

}  // namespace

void activations_to_bf16_amx(const float* x, int64_t cols, int64_t r0, int64_t r1, uint16_t* out) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * cols + c),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + r * cols + c))));
}

void packed_matmul_bf16_amx(const PackedView& w, const uint16_t* xb, int64_t n, float* y, int64_t ldy, int64_t p0,
                            int64_t p1) {
  static const TileConfig config;
  _tile_loadconfig(&config);  // the calling thread's tile state; nothing else here sets it
  auto run = [&](auto scale_type) {
    constexpr SourceType ST = decltype(scale_type)::value;
    w.bits == 8 ? panels<8, ST>(w, xb, n, y, ldy, p0, p1) : panels<4, ST>(w, xb, n, y, ldy, p0, p1);
  };
  switch (w.scale_type) {
    case SourceType::f16: run(std::integral_constant<SourceType, SourceType::f16>{}); break;
    case SourceType::bf16: run(std::integral_constant<SourceType, SourceType::bf16>{}); break;
    case SourceType::f32: run(std::integral_constant<SourceType, SourceType::f32>{}); break;
  }
  _tile_release();
}

}  // namespace tierlm::kernels
