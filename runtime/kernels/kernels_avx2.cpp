// runtime/kernels/kernels_avx2.cpp — AVX2/FMA/F16C kernels for CPUs without AVX-512 VNNI. Compiled with AVX2
// flags; reached only through run-time dispatch. Math is the scalar oracle's (kernels_scalar.cpp).
//
// Packed weights are walked in 8-row halves of a panel (bytes [0,32) and [32,64) of every 64-byte quad).
// There is no unsigned x signed int8 dot product without saturation here, so: 4-bit codes use maddubs directly
// (15*127*2 fits int16); q8_0 recovers the signed code q = u ^ 0x80 and uses maddubs(|x|, sign(q, x)); MLX 8-bit
// codes (0..255) are split into nibbles, each maddubs'ed, and recombined as 16*high + low.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

void quantize_row_avx2(const float* x, int64_t cols, int8_t* q, float* dx, int32_t* isum, float* xsum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + b * kActBlock + i * 8);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], abs_mask));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float scale = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    const int32_t sum =
        hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
    const __m256i w16a = _mm256_packs_epi32(qi[0], qi[1]);
    const __m256i w16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i w8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16a, w16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kActBlock), w8);
    dx[b] = scale;
    isum[b] = sum;
    xsum[b] = scale * static_cast<float>(sum);
  }
}

// Kinds of 8-row int8 dot product (see the file comment).
enum class DotKind { nibble4, signed8, unsigned8 };

template <int T, DotKind K, SourceType ST>
inline void half_panel_tile(const PackedView& w, int64_t p, int half, const QuantizedRow* x, float* y, int64_t ldy) {
  const uint8_t* panel = w.data + p * w.panel_bytes() + half * 32;
  const int64_t groups = w.groups();
  const int blocks_per_group = w.group / kActBlock;
  const bool symmetric = w.symmetric();
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i sixteen16 = _mm256_set1_epi16(16);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 yacc[T];
  for (int t = 0; t < T; ++t) yacc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t si = (p * groups + g) * kPanelRows + half * 8;
    const __m256 d = load_scales8<ST>(w.d, si);
    const __m256 m = symmetric ? _mm256_setzero_ps() : load_scales8<ST>(w.m, si);
    for (int s = 0; s < blocks_per_group; ++s) {
      const int64_t b = g * blocks_per_group + s;
      __m256i acc[T];
      for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
      if constexpr (K == DotKind::nibble4) {
        const uint8_t* base = panel + b * 256;
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + c * 64));
          const __m256i lo = _mm256_and_si256(v, low_nibbles);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibbles);
          for (int t = 0; t < T; ++t) {
            const __m256i plo = _mm256_maddubs_epi16(lo, broadcast4(x[t].q + b * 32 + c * 4));
            const __m256i phi = _mm256_maddubs_epi16(hi, broadcast4(x[t].q + b * 32 + (c + 4) * 4));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_add_epi16(plo, phi), ones16));
          }
        }
      } else {
        const uint8_t* base = panel + b * 8 * 64;
        for (int k = 0; k < 8; ++k) {
          const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + k * 64));
          if constexpr (K == DotKind::signed8) {
            const __m256i qw = _mm256_xor_si256(u, flip);
            for (int t = 0; t < T; ++t) {
              const __m256i xv = broadcast4(x[t].q + b * 32 + k * 4);
              const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(qw, xv));
              acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(prod, ones16));
            }
          } else {
            const __m256i lo = _mm256_and_si256(u, low_nibbles);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(u, 4), low_nibbles);
            for (int t = 0; t < T; ++t) {
              const __m256i xv = broadcast4(x[t].q + b * 32 + k * 4);
              acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xv), sixteen16));
              acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xv), ones16));
            }
          }
        }
      }
      // signed8 already produced sum(q * x); the others produced sum(u * x) and add the bias term.
      for (int t = 0; t < T; ++t) {
        yacc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x[t].dx[b])), _mm256_cvtepi32_ps(acc[t]), yacc[t]);
        if (!symmetric) yacc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(x[t].xsum[b]), yacc[t]);
      }
    }
  }
  const int64_t first = p * kPanelRows + half * 8;
  const int valid = static_cast<int>(std::clamp<int64_t>(w.rows - first, 0, 8));
  for (int t = 0; t < T; ++t) {
    if (valid == 8) {
      _mm256_storeu_ps(y + t * ldy + first, yacc[t]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, yacc[t]);
      for (int r = 0; r < valid; ++r) y[t * ldy + first + r] = tmp[r];
    }
  }
}

template <DotKind K, SourceType ST>
void packed_matmul_typed(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                         int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    for (int half = 0; half < 2; ++half) {
      if (p * kPanelRows + half * 8 >= w.rows) break;
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) half_panel_tile<4, K, ST>(w, p, half, x + i, y + i * ldy, ldy);
      if (n - i >= 2) {
        half_panel_tile<2, K, ST>(w, p, half, x + i, y + i * ldy, ldy);
        i += 2;
      }
      if (n - i >= 1) half_panel_tile<1, K, ST>(w, p, half, x + i, y + i * ldy, ldy);
    }
  }
}

template <SourceType ST>
void packed_matmul_scaled(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                          int64_t p1) {
  if (w.bits == 4) return packed_matmul_typed<DotKind::nibble4, ST>(w, x, n, y, ldy, p0, p1);
  if (w.symmetric()) return packed_matmul_typed<DotKind::signed8, ST>(w, x, n, y, ldy, p0, p1);
  return packed_matmul_typed<DotKind::unsigned8, ST>(w, x, n, y, ldy, p0, p1);
}

void packed_matmul_avx2(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                        int64_t p1) {
  switch (w.scale_type) {
    case SourceType::f16: return packed_matmul_scaled<SourceType::f16>(w, x, n, y, ldy, p0, p1);
    case SourceType::bf16: return packed_matmul_scaled<SourceType::bf16>(w, x, n, y, ldy, p0, p1);
    case SourceType::f32: return packed_matmul_scaled<SourceType::f32>(w, x, n, y, ldy, p0, p1);
  }
}

void packed_matvec_avx2(const PackedView& w, const QuantizedRow& x, float* y, int64_t p0, int64_t p1) {
  packed_matmul_avx2(w, &x, 1, y, 0, p0, p1);
}

template <WeightFormat F>
inline __m256 load_dense8(const void* w, int64_t index) {
  if constexpr (F == WeightFormat::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + index);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + index));
    if constexpr (F == WeightFormat::f16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <WeightFormat F>
inline float dense_scalar(const void* w, int64_t i) {
  if constexpr (F == WeightFormat::f32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (F == WeightFormat::f16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(w)[i]);
  } else {
    return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
}

template <WeightFormat F>
void dense_matvec_typed(const void* w, int64_t cols, const float* x, float* y, int64_t r0, int64_t r1) {
  const int64_t full = cols / 8 * 8;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t c = 0; c < full; c += 8) {
      const __m256 xv = _mm256_loadu_ps(x + c);
      for (int i = 0; i < 4; ++i) acc[i] = _mm256_fmadd_ps(load_dense8<F>(w, (r + i) * cols + c), xv, acc[i]);
    }
    for (int i = 0; i < 4; ++i) {
      float s = hsum(acc[i]);
      for (int64_t c = full; c < cols; ++c) s += dense_scalar<F>(w, (r + i) * cols + c) * x[c];
      y[r + i] = s;
    }
  }
  for (; r < r1; ++r) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < full; c += 8) acc = _mm256_fmadd_ps(load_dense8<F>(w, r * cols + c), _mm256_loadu_ps(x + c), acc);
    float s = hsum(acc);
    for (int64_t c = full; c < cols; ++c) s += dense_scalar<F>(w, r * cols + c) * x[c];
    y[r] = s;
  }
}

void dense_matvec_avx2(WeightFormat f, const void* w, int64_t cols, const float* x, float* y, int64_t r0, int64_t r1) {
  switch (f) {
    case WeightFormat::f16: return dense_matvec_typed<WeightFormat::f16>(w, cols, x, y, r0, r1);
    case WeightFormat::bf16: return dense_matvec_typed<WeightFormat::bf16>(w, cols, x, y, r0, r1);
    default: return dense_matvec_typed<WeightFormat::f32>(w, cols, x, y, r0, r1);
  }
}

template <WeightFormat F>
void dense_to_f32_typed(const void* w, int64_t begin, int64_t end, float* out) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) _mm256_storeu_ps(out + (i - begin), load_dense8<F>(w, i));
  for (; i < end; ++i) out[i - begin] = dense_scalar<F>(w, i);
}

void dense_to_f32_avx2(WeightFormat f, const void* w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  switch (f) {
    case WeightFormat::f16: return dense_to_f32_typed<WeightFormat::f16>(w, r0 * cols, r1 * cols, out);
    case WeightFormat::bf16: return dense_to_f32_typed<WeightFormat::bf16>(w, r0 * cols, r1 * cols, out);
    default: return dense_to_f32_typed<WeightFormat::f32>(w, r0 * cols, r1 * cols, out);
  }
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table{quantize_row_avx2, packed_matvec_avx2, packed_matmul_avx2, dense_matvec_avx2,
                                 dense_to_f32_avx2, nullptr};
  return table;
}

}  // namespace tierlm::kernels
