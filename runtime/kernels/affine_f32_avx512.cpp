// runtime/kernels/affine_f32_avx512.cpp — AVX-512 float-activation kernels for affine packed weights (MLX 4/8-bit);
// the math is affine_f32_scalar's (affine_f32.cpp). Reached only through affine_f32_kernel().
//
// A 64-byte quad holds 16 rows x 4 columns (row r in 32-bit lane r), so column j of the quad is lane-wise
// (v >> 8j) & 0xFF (4-bit: the low nibbles hold one quad, the high nibbles the quad four further on): one shift, one
// mask and one int->float convert give 16 rows' codes of a column as floats, which one FMA against the broadcast
// activation adds into a per-row f32 accumulator. Per group the accumulator is scaled once (d) and the bias term
// m * sum(x) added, as MLX's own kernels do. No horizontal reductions; tiles of up to 8 activation rows reuse each
// converted column.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* temporaries (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "runtime/kernels/affine_f32.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

// Decode streams each weight once; prefetching ahead keeps more DRAM requests in flight (as kernels_avx512.cpp).
constexpr int kPrefetchBytes = 4096;

// Lane-wise code (v >> Shift) & (2^Bits - 1) as f32.
template <int Shift, int Bits>
inline __m512 code_column(__m512i v) {
  if constexpr (Shift + Bits == 32) {
    return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, Shift));
  } else if constexpr (Shift == 0) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32((1 << Bits) - 1)));
  } else {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, Shift), _mm512_set1_epi32((1 << Bits) - 1)));
  }
}

// One panel against T activation rows.
template <int T, int Bits, SourceType ST>
inline void affine_tile(const PackedView& w, int64_t p, const float* x, const float* gsum, float* y, int64_t ldy) {
  const uint8_t* panel = w.data + p * w.panel_bytes();
  const int64_t groups = w.groups(), cols = w.cols;
  // Independent accumulator chains per activation row, so decode (T = 1) is not bound by FMA latency.
  constexpr int kChains = T == 1 ? 4 : (T == 2 ? 2 : 1);
  __m512 yacc[T];
  for (int t = 0; t < T; ++t) yacc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[kChains][T];
    for (int k = 0; k < kChains; ++k)
      for (int t = 0; t < T; ++t) acc[k][t] = _mm512_setzero_ps();
    const int64_t c0 = g * w.group, c1 = c0 + w.group;
    if constexpr (Bits == 8) {
      for (int64_t quad = c0 / 4; quad < c1 / 4; ++quad) {
        const uint8_t* q = panel + quad * 64;
        if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(q);
        unroll(std::make_integer_sequence<int, 4>{}, [&](auto column) {
          constexpr int j = decltype(column)::value;
          const __m512 wf = code_column<8 * j, 8>(v);
          for (int t = 0; t < T; ++t)
            acc[j % kChains][t] = _mm512_fmadd_ps(wf, _mm512_set1_ps(x[t * cols + quad * 4 + j]), acc[j % kChains][t]);
        });
      }
    } else {
      for (int64_t block = c0 / 32; block < c1 / 32; ++block) {
        for (int c = 0; c < 4; ++c) {
          const uint8_t* q = panel + block * 256 + c * 64;
          if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(q);
          const float* xc = x + block * 32 + c * 4;
          unroll(std::make_integer_sequence<int, 8>{}, [&](auto column) {
            constexpr int k = decltype(column)::value, high = k / 4, j = k % 4;  // nibble plane, byte in the lane
            const __m512 wf = code_column<8 * j + 4 * high, 4>(v);
            for (int t = 0; t < T; ++t)
              acc[k % kChains][t] = _mm512_fmadd_ps(wf, _mm512_set1_ps(xc[t * cols + high * 16 + j]), acc[k % kChains][t]);
          });
        }
      }
    }
    const int64_t si = (p * groups + g) * kPanelRows;
    const __m512 d = load_scales16<ST>(w.d, si), m = load_scales16<ST>(w.m, si);
    for (int t = 0; t < T; ++t) {
      __m512 sum = acc[0][t];
      for (int k = 1; k < kChains; ++k) sum = _mm512_add_ps(sum, acc[k][t]);
      yacc[t] = _mm512_fmadd_ps(d, sum, yacc[t]);
      yacc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(gsum[t * groups + g]), yacc[t]);
    }
  }
  const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, w.rows - p * kPanelRows));
  const __mmask16 mask = valid >= kPanelRows ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy + p * kPanelRows, mask, yacc[t]);
}

template <int Bits, SourceType ST>
void affine_typed(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy, int64_t p0,
                  int64_t p1) {
  const int64_t groups = w.groups(), cols = w.cols;
  for (int64_t p = p0; p < p1; ++p) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) affine_tile<8, Bits, ST>(w, p, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
    if (n - i >= 4) {
      affine_tile<4, Bits, ST>(w, p, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
      i += 4;
    }
    if (n - i >= 2) {
      affine_tile<2, Bits, ST>(w, p, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
      i += 2;
    }
    if (n - i >= 1) affine_tile<1, Bits, ST>(w, p, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
  }
}

template <SourceType ST>
void affine_bits(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy, int64_t p0,
                 int64_t p1) {
  if (w.bits == 8) return affine_typed<8, ST>(w, x, gsum, n, y, ldy, p0, p1);
  affine_typed<4, ST>(w, x, gsum, n, y, ldy, p0, p1);
}

}  // namespace

void affine_f32_avx512(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                       int64_t p0, int64_t p1) {
  switch (w.scale_type) {
    case SourceType::f16: return affine_bits<SourceType::f16>(w, x, gsum, n, y, ldy, p0, p1);
    case SourceType::bf16: return affine_bits<SourceType::bf16>(w, x, gsum, n, y, ldy, p0, p1);
    case SourceType::f32: return affine_bits<SourceType::f32>(w, x, gsum, n, y, ldy, p0, p1);
  }
}

}  // namespace tierlm::kernels
