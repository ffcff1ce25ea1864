// runtime/kernels/dense_gemm_avx512.cpp — prefill GEMM over dense f32/f16/bf16 weights with AVX-512: Y = X · Wᵀ for
// a block of activation rows and a block of weight rows, on one thread.
//
// Why not widen the weight to f32 and call sgemm: the widened copy is as large as the weight in f32 (a 4x RAM
// stream per chunk), and OpenBLAS' own threads fight the pool's (the pool pins its caller, so OpenBLAS' threads
// inherited one core: f16 prefill did not scale past one core). f32 weights took OpenBLAS' sgemm directly until
// its threads, woken between the pool's work, ran a 128-row chunk's projections at 180-220 GFLOP/s on the device's
// 16 cores where this kernel runs bf16 at ~900. Here each pool thread packs 64 weight rows x 256 columns at a time
// to f32 on its own stack (64 KiB, in L2), transposed so that one column step of 32 rows is two vectors, and a
// 12 x 32 register tile (24 accumulators) multiplies every activation row against that block while it is hot. Each
// weight element is converted once per call, each FMA takes its activation from an embedded broadcast, and the
// arithmetic is f32 FMA of exactly widened weights, as the sgemm path was. A row's result does not depend on how
// many rows are multiplied with it, nor on which block of rows it is in.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

namespace {

constexpr int kTileRows = 12;      // activation rows per register tile
constexpr int kTileCols = 32;      // weight rows per register tile (two vectors)
constexpr int kBlockCols = 64;     // weight rows packed at once (two tiles)
constexpr int64_t kDepth = 256;    // columns (the shared dimension) packed at once

// The 16 x 16 transpose: each pass swaps bit `b` of the register index with bit `b` of the lane index, so four
// passes (b = 1, 2, 4, 8) move element [i][j] to [j][i].
template <int B>
inline void transpose_pass(__m512 (&r)[16]) {
  alignas(64) int low[16], high[16];
  for (int j = 0; j < 16; ++j) {
    low[j] = (j & B) ? 16 + j - B : j;
    high[j] = (j & B) ? 16 + j : j + B;
  }
  const __m512i lo = _mm512_load_si512(low), hi = _mm512_load_si512(high);
  for (int i = 0; i < 16; ++i) {
    if (i & B) continue;
    const __m512 a = r[i], b = r[i + B];
    r[i] = _mm512_permutex2var_ps(a, lo, b);
    r[i + B] = _mm512_permutex2var_ps(a, hi, b);
  }
}

// The zero-masking forms throughout: GCC 12's unmasked ones start from _mm512_undefined_*(), which -Wextra reports
// as maybe-uninitialized once inlined into the transpose.
template <WeightFormat F>
using Element = std::conditional_t<F == WeightFormat::f32, float, uint16_t>;

template <WeightFormat F>
inline __m512 load16(const Element<F>* p, __mmask16 mask) {
  if constexpr (F == WeightFormat::f32) {
    return _mm512_maskz_loadu_ps(mask, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
    if constexpr (F == WeightFormat::f16) {
      return _mm512_maskz_cvtph_ps(mask, h);
    } else {
      return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(mask, _mm512_maskz_cvtepu16_epi32(mask, h), 16));
    }
  }
}

// packed[t][k][j] = W[r0 + 32t + j][k0 + k] as f32 for t < 2, k < depth, j < 32; rows past `rows` are zero.
template <WeightFormat F>
void pack_block(const Element<F>* w, int64_t cols, int64_t r0, int64_t rows, int64_t k0, int64_t depth,
                float* packed) {
  for (int64_t j0 = 0; j0 < kBlockCols; j0 += 16) {
    float* dst = packed + (j0 / kTileCols) * kDepth * kTileCols + (j0 % kTileCols);
    for (int64_t k = 0; k < depth; k += 16) {
      const __mmask16 mask = depth - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (depth - k)) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t row = r0 + j0 + i;
        r[i] = row < rows ? load16<F>(w + row * cols + k0 + k, mask) : _mm512_setzero_ps();
      }
      transpose_pass<1>(r);
      transpose_pass<2>(r);
      transpose_pass<4>(r);
      transpose_pass<8>(r);
      const int64_t steps = std::min<int64_t>(16, depth - k);
      for (int64_t s = 0; s < steps; ++s) _mm512_store_ps(dst + (k + s) * kTileCols, r[s]);
    }
  }
}

// Y[i][0..32) (+)= X[i][0..depth) · packed tile, for i < M; `m0`/`m1` mask the weight rows that exist.
template <int M>
void tile(const float* x, int64_t ldx, const float* packed, int64_t depth, float* y, int64_t ldy, __mmask16 m0,
          __mmask16 m1, bool accumulate) {
  __m512 c0[M], c1[M];
  for (int i = 0; i < M; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < depth; ++k) {
    const __m512 w0 = _mm512_load_ps(packed + k * kTileCols);
    const __m512 w1 = _mm512_load_ps(packed + k * kTileCols + 16);
    for (int i = 0; i < M; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * ldx + k]);
      c0[i] = _mm512_fmadd_ps(xv, w0, c0[i]);
      c1[i] = _mm512_fmadd_ps(xv, w1, c1[i]);
    }
  }
  for (int i = 0; i < M; ++i) {
    float* row = y + i * ldy;
    if (accumulate) {
      c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(m0, row));
      c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(m1, row + 16));
    }
    _mm512_mask_storeu_ps(row, m0, c0[i]);
    _mm512_mask_storeu_ps(row + 16, m1, c1[i]);
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, __mmask16, __mmask16, bool);

template <int... M>
constexpr auto make_tiles(std::integer_sequence<int, M...>) {
  return std::array<TileFn, sizeof...(M)>{tile<M + 1>...};
}
constexpr auto kTiles = make_tiles(std::make_integer_sequence<int, kTileRows>{});

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? 0 : __mmask16((1u << n) - 1); }

template <WeightFormat F>
void dense_matmul_typed(const void* weights, int64_t rows, int64_t cols, const float* x, int64_t i0, int64_t i1,
                        float* y, int64_t ldy, int64_t r0, int64_t r1) {
  alignas(64) float packed[2 * kDepth * kTileCols];
  const auto* w = static_cast<const Element<F>*>(weights);
  const int64_t row_end = std::min(r1, rows);
  for (int64_t b = r0; b < row_end; b += kBlockCols) {
    for (int64_t k0 = 0; k0 < cols; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, cols - k0);
      pack_block<F>(w, cols, b, row_end, k0, depth, packed);
      for (int64_t i = i0; i < i1; i += kTileRows) {
        const int64_t m = std::min<int64_t>(kTileRows, i1 - i);
        for (int t = 0; t < 2; ++t) {
          const int64_t first = b + t * kTileCols, valid = row_end - first;
          if (valid <= 0) break;
          kTiles[m - 1](x + i * cols + k0, cols, packed + t * kDepth * kTileCols, depth, y + i * ldy + first, ldy,
                        lanes(valid), lanes(valid - 16), k0 > 0);
        }
      }
    }
  }
}

}  // namespace

void dense_matmul_avx512(WeightFormat f, const void* w, int64_t rows, int64_t cols, const float* x, int64_t i0,
                         int64_t i1, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  switch (f) {
    case WeightFormat::f16: return dense_matmul_typed<WeightFormat::f16>(w, rows, cols, x, i0, i1, y, ldy, r0, r1);
    case WeightFormat::bf16: return dense_matmul_typed<WeightFormat::bf16>(w, rows, cols, x, i0, i1, y, ldy, r0, r1);
    default: return dense_matmul_typed<WeightFormat::f32>(w, rows, cols, x, i0, i1, y, ldy, r0, r1);
  }
}

}  // namespace tierlm::kernels
