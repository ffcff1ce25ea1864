// runtime/kernels/simd_scales.h — internal: loading a panel's per-row group scales (f32, f16 or bf16, see
// kernel_isa.h) widened to f32 vectors, shared by the SIMD kernel files of each ISA.
// Never: included outside *_avx2.cpp / *_avx512.cpp (the intrinsics need their ISA flags).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "runtime/kernels/kernel_isa.h"

namespace tierlm::kernels {

#if defined(__AVX2__) && defined(__F16C__)
// 8 scales (one 8-row half of a panel) from base[index].
template <SourceType ST>
inline __m256 load_scales8(const void* base, int64_t index) {
  if constexpr (ST == SourceType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    if constexpr (ST == SourceType::f16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}
#endif

#if defined(__AVX512F__)
// 16 scales (a whole panel) from base[index].
template <SourceType ST>
inline __m512 load_scales16(const void* base, int64_t index) {
  if constexpr (ST == SourceType::f32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + index);
  } else if constexpr (ST == SourceType::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + index)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + index));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
#endif

}  // namespace tierlm::kernels
