// runtime/kernels/affine_f32_avx512.cpp — AVX-512 float-activation kernels for affine packed weights (MLX 4/8-bit):
// affine_f32_simd.h over 16-row vectors (a whole panel), tiles of up to 8 activation rows. Reached only through
// affine_f32_kernel().
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* temporaries (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "runtime/kernels/affine_f32_simd.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kRows = 16, kMaxTile = 8;
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  template <int Shift, int Bits>
  static F code(I v) {  // lane-wise (v >> Shift) & (2^Bits - 1) as f32
    if constexpr (Shift + Bits == 32) {
      return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, Shift));
    } else if constexpr (Shift == 0) {
      return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32((1 << Bits) - 1)));
    } else {
      return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, Shift), _mm512_set1_epi32((1 << Bits) - 1)));
    }
  }
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float f) { return _mm512_set1_ps(f); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  template <SourceType ST>
  static F scales(const void* base, int64_t index) { return load_scales16<ST>(base, index); }
  static void store(float* y, F v, int valid) {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << valid) - 1), v);
  }
};

}  // namespace

void affine_f32_avx512(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                       int64_t p0, int64_t p1) {
  affine_simd::multiply<Avx512>(w, x, gsum, n, y, ldy, p0, p1);
}

}  // namespace tierlm::kernels
