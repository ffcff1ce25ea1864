// runtime/kernels/mxfp4_avx512.cpp — the MXFP4 row kernel with AVX-512 (see mxfp4.h): per block, the 16 code bytes
// widen to 16 low and 16 high nibbles, vpermps looks both up in the E2M1 table, and they meet the even and odd
// activations (split once per call by mxfp4_split_activations) in two FMAs; the block sum is scaled by its power of
// two into a 16-lane accumulator. Weights are decoded once per block and used for up to 4 activation rows.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* temporaries (GCC bug
// 105593); nothing in this file reads uninitialized data.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "runtime/kernels/mxfp4.h"

namespace tierlm::kernels {

void mxfp4_rows_avx512(const uint8_t* blocks, const uint8_t* scales, int64_t cols, int64_t r0, int64_t r1,
                       const float* x_split, int64_t n, float* y, int64_t y_stride) {
  const int64_t groups = cols / kMxfp4Block;
  const __m512 table = _mm512_loadu_ps(kE2M1);
  const __m512i low_mask = _mm512_set1_epi32(0x0F);
  constexpr int64_t kRowsAtOnce = 4;  // activation rows sharing one decoded block
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = blocks + r * groups * kMxfp4BlockBytes;
    const uint8_t* row_scales = scales + r * groups;
    for (int64_t t0 = 0; t0 < n; t0 += kRowsAtOnce) {
      const int64_t m = n - t0 < kRowsAtOnce ? n - t0 : kRowsAtOnce;
      __m512 acc[kRowsAtOnce] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                                 _mm512_setzero_ps()};
      for (int64_t g = 0; g < groups; ++g) {
        const __m512i codes =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * kMxfp4BlockBytes)));
        const __m512 w_even = _mm512_permutexvar_ps(_mm512_and_si512(codes, low_mask), table);
        const __m512 w_odd = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
        const __m512 scale = _mm512_set1_ps(e8m0_value(row_scales[g]));
        for (int64_t i = 0; i < m; ++i) {
          const float* xg = x_split + (t0 + i) * cols + g * kMxfp4Block;  // 16 even, then 16 odd inputs
          const __m512 even = _mm512_loadu_ps(xg), odd = _mm512_loadu_ps(xg + 16);
          const __m512 block = _mm512_fmadd_ps(w_odd, odd, _mm512_mul_ps(w_even, even));
          acc[i] = _mm512_fmadd_ps(block, scale, acc[i]);
        }
      }
      for (int64_t i = 0; i < m; ++i) y[(t0 + i) * y_stride + r] = _mm512_reduce_add_ps(acc[i]);
    }
  }
}

}  // namespace tierlm::kernels
