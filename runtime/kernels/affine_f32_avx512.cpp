// runtime/kernels/affine_f32_avx512.cpp — AVX-512 float-activation kernels for affine packed weights (MLX 4/8-bit);
// the math is affine_f32_scalar's (affine_f32.cpp). Reached only through affine_f32_kernel().
//
// A 64-byte quad holds 16 rows x 4 columns (row r in 32-bit lane r), so column j of the quad is lane-wise
// (v >> 8j) & 0xFF (4-bit: the low nibbles hold one quad, the high nibbles the quad four further on): one shift, one
// mask and one int->float convert give 16 rows' codes of a column as floats, which one FMA against the broadcast
// activation adds into a per-row f32 sum. Per group the accumulator is scaled once (d) and the bias term m * sum(x)
// added, as MLX's own kernels do. No horizontal reductions; tiles of up to 8 activation rows reuse each converted
// column, and the order of every sum is the same for any tile size.
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

// The 4 columns of one quad (codes as f32) times activation row t's 4 values, summed in a fixed order (x0, then
// + x1, + x2, + x3) and added to acc: the same order for every tile size, so a row's result does not depend on how
// many rows are multiplied with it (chunked prefill, batches and decode agree bit for bit), and decode's only
// loop-carried dependency is one add per quad.
inline __m512 quad_dot(const __m512 (&wf)[4], const float* x) {
  __m512 s = _mm512_mul_ps(wf[0], _mm512_set1_ps(x[0]));
  s = _mm512_fmadd_ps(wf[1], _mm512_set1_ps(x[1]), s);
  s = _mm512_fmadd_ps(wf[2], _mm512_set1_ps(x[2]), s);
  return _mm512_fmadd_ps(wf[3], _mm512_set1_ps(x[3]), s);
}

// One panel against T activation rows.
template <int T, int Bits, SourceType ST>
inline void affine_tile(const PackedView& w, int64_t p, const float* x, const float* gsum, float* y, int64_t ldy) {
  const uint8_t* panel = w.data + p * w.panel_bytes();
  const int64_t groups = w.groups(), cols = w.cols;
  __m512 yacc[T];
  for (int t = 0; t < T; ++t) yacc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const int64_t c0 = g * w.group, c1 = c0 + w.group;
    if constexpr (Bits == 8) {
      for (int64_t quad = c0 / 4; quad < c1 / 4; ++quad) {
        const uint8_t* q = panel + quad * 64;
        if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(q);
        const __m512 wf[4] = {code_column<0, 8>(v), code_column<8, 8>(v), code_column<16, 8>(v),
                              code_column<24, 8>(v)};
        for (int t = 0; t < T; ++t) acc[t] = _mm512_add_ps(acc[t], quad_dot(wf, x + t * cols + quad * 4));
      }
    } else {
      for (int64_t block = c0 / 32; block < c1 / 32; ++block) {
        for (int c = 0; c < 4; ++c) {
          const uint8_t* q = panel + block * 256 + c * 64;
          if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(q);
          const float* xc = x + block * 32 + c * 4;
          // The low nibbles hold quad 8*block + c, the high nibbles the quad 16 columns further on.
          const __m512 lo[4] = {code_column<0, 4>(v), code_column<8, 4>(v), code_column<16, 4>(v),
                                code_column<24, 4>(v)};
          for (int t = 0; t < T; ++t) acc[t] = _mm512_add_ps(acc[t], quad_dot(lo, xc + t * cols));
          const __m512 hi[4] = {code_column<4, 4>(v), code_column<12, 4>(v), code_column<20, 4>(v),
                                code_column<28, 4>(v)};
          for (int t = 0; t < T; ++t) acc[t] = _mm512_add_ps(acc[t], quad_dot(hi, xc + t * cols + 16));
        }
      }
    }
  const int64_t si = (p * groups + g) * kPanelRows;
    const __m512 d = load_scales16<ST>(w.d, si), m = load_scales16<ST>(w.m, si);
    for (int t = 0; t < T; ++t) {
      yacc[t] = _mm512_fmadd_ps(d, acc[t], yacc[t]);
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
