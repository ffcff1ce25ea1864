// AVX-512 attention block kernels. Keys: 16 positions of a panel in the 16 lanes, one dimension per step, so a
// turbo code becomes a centroid by one permute shared by every head of the group. Values: 16 dims in the lanes,
// accumulators held in registers across the positions of a page.
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_* temporaries (GCC bug
// 105593); nothing here reads uninitialized data.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>

#include "runtime/kv/attention.h"
#include "runtime/kv/turbo_quant.h"

namespace tierlm::kv {

namespace {

template <class T> const T* at(const uint8_t* base, size_t offset) {
  return reinterpret_cast<const T*>(base + offset);
}

inline int panels_for(int tokens) { return (tokens + kPanel - 1) / kPanel; }

// 16 lanes of codes from `bits` u16 bit-planes (bit i of plane w = bit w of lane i's code).
template <int BITS> inline __m512i unpack_codes(const uint16_t* planes) {
  __m512i idx = _mm512_maskz_mov_epi32(__mmask16(planes[0]), _mm512_set1_epi32(1));
  if constexpr (BITS > 1) idx = _mm512_mask_or_epi32(idx, __mmask16(planes[1]), idx, _mm512_set1_epi32(2));
  if constexpr (BITS > 2) idx = _mm512_mask_or_epi32(idx, __mmask16(planes[2]), idx, _mm512_set1_epi32(4));
  if constexpr (BITS > 3) idx = _mm512_mask_or_epi32(idx, __mmask16(planes[3]), idx, _mm512_set1_epi32(8));
  return idx;
}

template <int H>
void score_dense(const CodecLayout& L, const uint8_t* keys, int tokens, const QueryGroup& q, float* scores) {
  const int d = L.head_dim;
  for (int p = 0; p < panels_for(tokens); ++p) {
    __m512 acc[H];
    for (int h = 0; h < H; ++h) acc[h] = _mm512_setzero_ps();
    if (L.codec == Codec::f32) {
      const float* base = at<float>(keys, 0) + size_t(p) * d * kPanel;
      for (int j = 0; j < d; ++j) {
        const __m512 k = _mm512_loadu_ps(base + size_t(j) * kPanel);
        for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(q.a[h * d + j]), k, acc[h]);
      }
    } else if (L.codec == Codec::f16) {
      const uint16_t* base = at<uint16_t>(keys, 0) + size_t(p) * d * kPanel;
      for (int j = 0; j < d; ++j) {
        const __m512 k = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + size_t(j) * kPanel)));
        for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(q.a[h * d + j]), k, acc[h]);
      }
    } else {  // q8
      const int8_t* base = at<int8_t>(keys, 0) + size_t(p) * d * kPanel;
      const uint16_t* scales = at<uint16_t>(keys, L.key_scales);
      const int nb = d / L.q8_block;
      for (int b = 0; b < nb; ++b) {
        __m512 part[H];
        for (int h = 0; h < H; ++h) part[h] = _mm512_setzero_ps();
        for (int j = b * L.q8_block; j < (b + 1) * L.q8_block; ++j) {
          const __m512 k = _mm512_cvtepi32_ps(
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + size_t(j) * kPanel))));
          for (int h = 0; h < H; ++h) part[h] = _mm512_fmadd_ps(_mm512_set1_ps(q.a[h * d + j]), k, part[h]);
        }
        const __m512 s = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + (size_t(p) * nb + b) * kPanel)));
        for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(part[h], s, acc[h]);
      }
    }
    for (int h = 0; h < H; ++h) _mm512_storeu_ps(scores + h * kBlockTokens + p * kPanel, acc[h]);
  }
}

template <int H, int BITS, bool QJL>
void score_turbo(const CodecLayout& L, const uint8_t* keys, int tokens, const QueryGroup& q, float* scores) {
  const int d = L.head_dim, W = BITS + (QJL ? 1 : 0);
  const __m512 table = _mm512_loadu_ps(TurboTables::get(d).centroids(BITS).data());
  for (int p = 0; p < panels_for(tokens); ++p) {
    const uint16_t* planes = at<uint16_t>(keys, 0) + size_t(p) * d * W;
    __m512 acc[H], sgn[H];
    for (int h = 0; h < H; ++h) acc[h] = sgn[h] = _mm512_setzero_ps();
    for (int j = 0; j < d; ++j, planes += W) {
      const __m512 c = _mm512_permutexvar_ps(unpack_codes<BITS>(planes), table);
      for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(q.a[h * d + j]), c, acc[h]);
      if constexpr (QJL) {
        const __mmask16 k = __mmask16(planes[BITS]);
        for (int h = 0; h < H; ++h) sgn[h] = _mm512_mask_add_ps(sgn[h], k, sgn[h], _mm512_set1_ps(q.b[h * d + j]));
      }
    }
    const __m512 norm = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at<uint16_t>(keys, L.key_norms) + p * kPanel)));
    __m512 rn = _mm512_setzero_ps();
    if constexpr (QJL)
      rn = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at<uint16_t>(keys, L.key_residual_norms) + p * kPanel)));
    for (int h = 0; h < H; ++h) {
      __m512 s = acc[h];
      if constexpr (QJL) {
        const __m512 dot = _mm512_fmsub_ps(_mm512_set1_ps(2.0f), sgn[h], _mm512_set1_ps(q.b_sum[h]));
        s = _mm512_fmadd_ps(rn, dot, s);
      }
      _mm512_storeu_ps(scores + h * kBlockTokens + p * kPanel, _mm512_mul_ps(norm, s));
    }
  }
}

template <int H>
void accumulate_dense(const CodecLayout& L, const uint8_t* values, int tokens, const float* weights, float* acc) {
  const int d = L.head_dim;
  const int nb = L.codec == Codec::q8 ? d / L.q8_block : 0;
  for (int c = 0; c < d / 16; ++c) {
    __m512 ac[H];
    for (int h = 0; h < H; ++h) ac[h] = _mm512_loadu_ps(acc + size_t(h) * d + c * 16);
    for (int t = 0; t < tokens; ++t) {
      const size_t off = size_t(t) * d + size_t(c) * 16;
      __m512 v;
      float scale = 1.0f;
      if (L.codec == Codec::f32) {
        v = _mm512_loadu_ps(at<float>(values, 0) + off);
      } else if (L.codec == Codec::f16) {
        v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at<uint16_t>(values, 0) + off)));
      } else {
        v = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at<int8_t>(values, 0) + off))));
        scale = _cvtsh_ss(at<uint16_t>(values, L.value_scales)[size_t(t) * nb + size_t(c) * 16 / L.q8_block]);
      }
      for (int h = 0; h < H; ++h) ac[h] = _mm512_fmadd_ps(_mm512_set1_ps(weights[h * kBlockTokens + t] * scale), v, ac[h]);
    }
    for (int h = 0; h < H; ++h) _mm512_storeu_ps(acc + size_t(h) * d + c * 16, ac[h]);
  }
}

template <int H, int BITS>
void accumulate_turbo(const CodecLayout& L, const uint8_t* values, int tokens, const float* weights, float* acc) {
  const int d = L.head_dim, chunks = d / 16;
  const __m512 table = _mm512_loadu_ps(TurboTables::get(d).centroids(BITS).data());
  alignas(64) float w[H][kBlockTokens];
  const uint16_t* norms = at<uint16_t>(values, L.value_norms);
  for (int p = 0; p < kPanels; ++p) {
    const __m512 n = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(norms + p * kPanel)));
    for (int h = 0; h < H; ++h)
      _mm512_store_ps(&w[h][p * kPanel], _mm512_mul_ps(n, _mm512_loadu_ps(weights + h * kBlockTokens + p * kPanel)));
  }
  const uint16_t* planes = at<uint16_t>(values, 0);
  for (int c = 0; c < chunks; ++c) {
    __m512 ac[H];
    for (int h = 0; h < H; ++h) ac[h] = _mm512_loadu_ps(acc + size_t(h) * d + c * 16);
    for (int t = 0; t < tokens; ++t) {
      const __m512 v = _mm512_permutexvar_ps(unpack_codes<BITS>(planes + (size_t(t) * chunks + c) * BITS), table);
      for (int h = 0; h < H; ++h) ac[h] = _mm512_fmadd_ps(_mm512_set1_ps(w[h][t]), v, ac[h]);
    }
    for (int h = 0; h < H; ++h) _mm512_storeu_ps(acc + size_t(h) * d + c * 16, ac[h]);
  }
}

// exp for x <= 0: 2^(x log2 e) = 2^n * 2^f, |f| <= 1/2, 2^f by its degree-6 Taylor polynomial (rel. error ~2e-7).
// Below kSoftmaxExpFloor it is exactly 0 rather than a denormal (see attention.h): those weights, under 1.7e-38 of
// the block's largest, change nothing, while a denormal operand costs an x86 FMA a microcode assist.
inline __m512 exp_ps(__m512 x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kSoftmaxExpFloor), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(kSoftmaxExpFloor));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718056f));
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(normal, p, n);
}

float exp_sum_avx512(float* x, int count, float max) {
  __m512 sum = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(max);
  for (int i = 0; i < count; i += 16) {
    const __mmask16 k = count - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (count - i)) - 1);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

template <int H>
void score_h(const CodecLayout& L, const uint8_t* keys, int tokens, const QueryGroup& q, float* scores) {
  if (!L.is_turbo()) return score_dense<H>(L, keys, tokens, q, scores);
  const bool qjl = L.turbo.key_qjl;
  switch (L.turbo.key_bits) {
    case 1: return qjl ? score_turbo<H, 1, true>(L, keys, tokens, q, scores) : score_turbo<H, 1, false>(L, keys, tokens, q, scores);
    case 2: return qjl ? score_turbo<H, 2, true>(L, keys, tokens, q, scores) : score_turbo<H, 2, false>(L, keys, tokens, q, scores);
    case 3: return qjl ? score_turbo<H, 3, true>(L, keys, tokens, q, scores) : score_turbo<H, 3, false>(L, keys, tokens, q, scores);
    default: return qjl ? score_turbo<H, 4, true>(L, keys, tokens, q, scores) : score_turbo<H, 4, false>(L, keys, tokens, q, scores);
  }
}

void score_avx512(const CodecLayout& L, const uint8_t* keys, int tokens, const QueryGroup& q, float* scores) {
  switch (q.heads) {
    case 1: return score_h<1>(L, keys, tokens, q, scores);
    case 2: return score_h<2>(L, keys, tokens, q, scores);
    case 3: return score_h<3>(L, keys, tokens, q, scores);
    default: return score_h<4>(L, keys, tokens, q, scores);
  }
}

template <int H>
void accumulate_h(const CodecLayout& L, const uint8_t* values, int tokens, const float* weights, float* acc) {
  if (!L.is_turbo()) return accumulate_dense<H>(L, values, tokens, weights, acc);
  switch (L.turbo.value_bits) {
    case 1: return accumulate_turbo<H, 1>(L, values, tokens, weights, acc);
    case 2: return accumulate_turbo<H, 2>(L, values, tokens, weights, acc);
    case 3: return accumulate_turbo<H, 3>(L, values, tokens, weights, acc);
    default: return accumulate_turbo<H, 4>(L, values, tokens, weights, acc);
  }
}

void accumulate_avx512(const CodecLayout& L, const uint8_t* values, int tokens, const float* weights, int heads,
                       float* acc) {
  switch (heads) {
    case 1: return accumulate_h<1>(L, values, tokens, weights, acc);
    case 2: return accumulate_h<2>(L, values, tokens, weights, acc);
    case 3: return accumulate_h<3>(L, values, tokens, weights, acc);
    default: return accumulate_h<4>(L, values, tokens, weights, acc);
  }
}

}  // namespace

const AttentionKernels& avx512_attention_kernels() {
  static const AttentionKernels k{score_avx512, accumulate_avx512, exp_sum_avx512};
  return k;
}

}  // namespace tierlm::kv
