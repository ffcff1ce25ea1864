// runtime/kernels/affine_f32_avx2.cpp — AVX2/FMA float-activation kernels for affine packed weights (MLX 4/8-bit);
// the math is affine_f32_scalar's (affine_f32.cpp). Reached only through affine_f32_kernel().
// The AVX-512 file's scheme on 8-row halves of a panel (bytes [0,32) and [32,64) of every 64-byte quad): per column a
// shift, a mask and an int->float convert give 8 rows' codes, one FMA per activation row accumulates them in f32.
#include <immintrin.h>

#include <algorithm>

#include "runtime/kernels/affine_f32.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

// Lane-wise code (v >> Shift) & (2^Bits - 1) as f32.
template <int Shift, int Bits>
inline __m256 code_column(__m256i v) {
  if constexpr (Shift + Bits == 32) {
    return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, Shift));
  } else if constexpr (Shift == 0) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32((1 << Bits) - 1)));
  } else {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, Shift), _mm256_set1_epi32((1 << Bits) - 1)));
  }
}

// The AVX-512 file's quad_dot: one quad's 4 columns times row t's 4 activations in a fixed order, whatever the tile.
inline __m256 quad_dot(const __m256 (&wf)[4], const float* x) {
  __m256 s = _mm256_mul_ps(wf[0], _mm256_set1_ps(x[0]));
  s = _mm256_fmadd_ps(wf[1], _mm256_set1_ps(x[1]), s);
  s = _mm256_fmadd_ps(wf[2], _mm256_set1_ps(x[2]), s);
  return _mm256_fmadd_ps(wf[3], _mm256_set1_ps(x[3]), s);
}

// One 8-row half of a panel against T activation rows.
template <int T, int Bits, SourceType ST>
inline void affine_half_tile(const PackedView& w, int64_t p, int half, const float* x, const float* gsum, float* y,
                             int64_t ldy) {
  const uint8_t* panel = w.data + p * w.panel_bytes() + half * 32;
  const int64_t groups = w.groups(), cols = w.cols;
  __m256 yacc[T];
  for (int t = 0; t < T; ++t) yacc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    const int64_t c0 = g * w.group, c1 = c0 + w.group;
    if constexpr (Bits == 8) {
      for (int64_t quad = c0 / 4; quad < c1 / 4; ++quad) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + quad * 64));
        const __m256 wf[4] = {code_column<0, 8>(v), code_column<8, 8>(v), code_column<16, 8>(v),
                              code_column<24, 8>(v)};
        for (int t = 0; t < T; ++t) acc[t] = _mm256_add_ps(acc[t], quad_dot(wf, x + t * cols + quad * 4));
      }
    } else {
      for (int64_t block = c0 / 32; block < c1 / 32; ++block) {
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + block * 256 + c * 64));
          const float* xc = x + block * 32 + c * 4;
          const __m256 lo[4] = {code_column<0, 4>(v), code_column<8, 4>(v), code_column<16, 4>(v),
                                code_column<24, 4>(v)};
          for (int t = 0; t < T; ++t) acc[t] = _mm256_add_ps(acc[t], quad_dot(lo, xc + t * cols));
          const __m256 hi[4] = {code_column<4, 4>(v), code_column<12, 4>(v), code_column<20, 4>(v),
                                code_column<28, 4>(v)};
          for (int t = 0; t < T; ++t) acc[t] = _mm256_add_ps(acc[t], quad_dot(hi, xc + t * cols + 16));
        }
      }
    }
    const int64_t si = (p * groups + g) * kPanelRows + half * 8;
    const __m256 d = load_scales8<ST>(w.d, si), m = load_scales8<ST>(w.m, si);
    for (int t = 0; t < T; ++t) {
      yacc[t] = _mm256_fmadd_ps(d, acc[t], yacc[t]);
      yacc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(gsum[t * groups + g]), yacc[t]);
    }
  }
  const int64_t row0 = p * kPanelRows + half * 8;
  const int valid = static_cast<int>(std::clamp<int64_t>(w.rows - row0, 0, 8));
  for (int t = 0; t < T; ++t) {
    if (valid == 8) {
      _mm256_storeu_ps(y + t * ldy + row0, yacc[t]);
    } else {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, yacc[t]);
      std::copy(lanes, lanes + valid, y + t * ldy + row0);
    }
  }
}

template <int Bits, SourceType ST>
void affine_typed(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy, int64_t p0,
                  int64_t p1) {
  const int64_t groups = w.groups(), cols = w.cols;
  for (int64_t p = p0; p < p1; ++p) {
    for (int half = 0; half < 2; ++half) {
      if (p * kPanelRows + half * 8 >= w.rows) break;
      int64_t i = 0;
      for (; i + 4 <= n; i += 4)
        affine_half_tile<4, Bits, ST>(w, p, half, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
      if (n - i >= 2) {
        affine_half_tile<2, Bits, ST>(w, p, half, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
        i += 2;
      }
      if (n - i >= 1) affine_half_tile<1, Bits, ST>(w, p, half, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
    }
  }
}

template <SourceType ST>
void affine_bits(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy, int64_t p0,
                 int64_t p1) {
  if (w.bits == 8) return affine_typed<8, ST>(w, x, gsum, n, y, ldy, p0, p1);
  affine_typed<4, ST>(w, x, gsum, n, y, ldy, p0, p1);
}

}  // namespace

void affine_f32_avx2(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                     int64_t p0, int64_t p1) {
  switch (w.scale_type) {
    case SourceType::f16: return affine_bits<SourceType::f16>(w, x, gsum, n, y, ldy, p0, p1);
    case SourceType::bf16: return affine_bits<SourceType::bf16>(w, x, gsum, n, y, ldy, p0, p1);
    case SourceType::f32: return affine_bits<SourceType::f32>(w, x, gsum, n, y, ldy, p0, p1);
  }
}

}  // namespace tierlm::kernels
