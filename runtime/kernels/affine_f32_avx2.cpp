// runtime/kernels/affine_f32_avx2.cpp — AVX2/FMA float-activation kernels for affine packed weights (MLX 4/8-bit):
// affine_f32_simd.h over 8-row vectors (bytes [0,32) and [32,64) of every 64-byte quad are a panel's two halves),
// tiles of up to 4 activation rows. Reached only through affine_f32_kernel().
#include <immintrin.h>

#include <algorithm>

#include "runtime/kernels/affine_f32_simd.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kRows = 8, kMaxTile = 4;
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  template <int Shift, int Bits>
  static F code(I v) {  // lane-wise (v >> Shift) & (2^Bits - 1) as f32
    if constexpr (Shift + Bits == 32) {
      return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, Shift));
    } else if constexpr (Shift == 0) {
      return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32((1 << Bits) - 1)));
    } else {
      return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, Shift), _mm256_set1_epi32((1 << Bits) - 1)));
    }
  }
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float f) { return _mm256_set1_ps(f); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  template <SourceType ST>
  static F scales(const void* base, int64_t index) { return load_scales8<ST>(base, index); }
  static void store(float* y, F v, int valid) {
    if (valid == kRows) return _mm256_storeu_ps(y, v);
    alignas(32) float lanes[kRows];
    _mm256_store_ps(lanes, v);
    std::copy(lanes, lanes + valid, y);
  }
};

}  // namespace

void affine_f32_avx2(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy,
                     int64_t p0, int64_t p1) {
  affine_simd::multiply<Avx2>(w, x, gsum, n, y, ldy, p0, p1);
}

}  // namespace tierlm::kernels
