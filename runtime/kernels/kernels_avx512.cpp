// runtime/kernels/kernels_avx512.cpp — AVX-512 (F/BW/VL/VNNI) kernels. Compiled with AVX-512 flags; reached only
// through run-time dispatch (kernel_dispatch.cpp). Math is the scalar oracle's (kernels_scalar.cpp).
//
// Packed weights: one vpdpbusd multiplies a 64-byte quad (16 rows x 4 unsigned codes) by a broadcast 4-byte chunk
// of the int8 activation, leaving one int32 partial sum per row; per 32 columns the int32 lanes are scaled once
// (d * dx) into a 16-row float accumulator. Prefill reuses each loaded quad across a tile of up to 8 activation rows.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* temporaries (GCC bug
// 105593, fixed in GCC 13); nothing in this file reads uninitialized data.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/simd_scales.h"

namespace tierlm::kernels {

namespace {

#ifndef TIERLM_PF
#define TIERLM_PF 4096
#endif
// Decode streams each weight once: software prefetch this far ahead keeps more DRAM requests in flight per core
// than the hardware prefetcher alone (measured in bench/kernels_bench.cpp).
constexpr int kPrefetchBytes = TIERLM_PF;

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

void quantize_row_avx512(const float* x, int64_t cols, int8_t* q, float* dx, int32_t* isum, float* xsum) {
  const __m512 sign_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < cols / kActBlock; ++b) {
    const __m512 a = _mm512_loadu_ps(x + b * kActBlock);
    const __m512 c = _mm512_loadu_ps(x + b * kActBlock + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(a, sign_mask), _mm512_and_ps(c, sign_mask)));
    const float scale = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
    const __m512i qc = _mm512_cvtps_epi32(_mm512_mul_ps(c, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kActBlock), _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kActBlock + 16), _mm512_cvtepi32_epi8(qc));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
    dx[b] = scale;
    isum[b] = sum;
    xsum[b] = scale * static_cast<float>(sum);
  }
}

inline void store_rows(float* y, __m512 v, int valid) {
  if (valid >= kPanelRows) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << valid) - 1), v);
  }
}

// One panel against T activation rows.
template <int T, int Bits, SourceType ST>
inline void panel_tile(const PackedView& w, int64_t p, const QuantizedRow* x, float* y, int64_t ldy) {
  const uint8_t* panel = w.data + p * w.panel_bytes();
  const int64_t groups = w.groups();
  const int blocks_per_group = w.group / kActBlock;
  const bool symmetric = w.symmetric();
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 yacc[T];
  for (int t = 0; t < T; ++t) yacc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t si = (p * groups + g) * kPanelRows;
    const __m512 d = load_scales16<ST>(w.d, si);
    const __m512 m = symmetric ? _mm512_setzero_ps() : load_scales16<ST>(w.m, si);
    for (int s = 0; s < blocks_per_group; ++s) {
      const int64_t b = g * blocks_per_group + s;
      // Two accumulator chains per activation row when registers allow, so a single row (decode) is not bound by
      // the latency of eight dependent vpdpbusd per block.
      constexpr int kChains = T <= 4 ? 2 : 1;
      __m512i acc[kChains][T];
      for (int t = 0; t < T; ++t) {
        acc[0][t] = symmetric ? _mm512_set1_epi32(-128 * x[t].isum[b]) : _mm512_setzero_si512();
        if constexpr (kChains == 2) acc[1][t] = _mm512_setzero_si512();
      }
      if constexpr (Bits == 8) {
        const uint8_t* base = panel + b * 8 * 64;
        if constexpr (T == 1) {
          for (int k = 0; k < 8; ++k) _mm_prefetch(reinterpret_cast<const char*>(base + kPrefetchBytes + k * 64), _MM_HINT_T0);
        }
        for (int k = 0; k < 8; ++k) {
          const __m512i wq = _mm512_loadu_si512(base + k * 64);
          for (int t = 0; t < T; ++t)
            acc[k % kChains][t] = _mm512_dpbusd_epi32(acc[k % kChains][t], wq, broadcast4(x[t].q + b * 32 + k * 4));
        }
      } else {
        const uint8_t* base = panel + b * 256;
        if constexpr (T == 1) {
          for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(base + kPrefetchBytes + c * 64), _MM_HINT_T0);
        }
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_loadu_si512(base + c * 64);
          const __m512i lo = _mm512_and_si512(v, low_nibbles);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_nibbles);
          for (int t = 0; t < T; ++t) {
            acc[0][t] = _mm512_dpbusd_epi32(acc[0][t], lo, broadcast4(x[t].q + b * 32 + c * 4));
            acc[kChains - 1][t] = _mm512_dpbusd_epi32(acc[kChains - 1][t], hi, broadcast4(x[t].q + b * 32 + (c + 4) * 4));
          }
        }
      }
      if constexpr (kChains == 2) {
        for (int t = 0; t < T; ++t) acc[0][t] = _mm512_add_epi32(acc[0][t], acc[1][t]);
      }
      for (int t = 0; t < T; ++t) {
        yacc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x[t].dx[b])), _mm512_cvtepi32_ps(acc[0][t]), yacc[t]);
        if (!symmetric) yacc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(x[t].xsum[b]), yacc[t]);
      }
    }
  }
  const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, w.rows - p * kPanelRows));
  for (int t = 0; t < T; ++t) store_rows(y + t * ldy + p * kPanelRows, yacc[t], valid);
}

template <int Bits, SourceType ST>
void packed_matmul_typed(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                         int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) panel_tile<8, Bits, ST>(w, p, x + i, y + i * ldy, ldy);
    // A tail of 1-7 rows in one pass over the panel: each pass loads and unpacks the panel's codes again.
    switch (n - i) {
      case 7: panel_tile<7, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      case 6: panel_tile<6, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      case 5: panel_tile<5, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      case 4: panel_tile<4, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      case 3: panel_tile<3, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      case 2: panel_tile<2, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      case 1: panel_tile<1, Bits, ST>(w, p, x + i, y + i * ldy, ldy); break;
      default: break;
    }
  }
}

void packed_matmul_avx512(const PackedView& w, const QuantizedRow* x, int64_t n, float* y, int64_t ldy, int64_t p0,
                          int64_t p1) {
  switch (w.scale_type) {
    case SourceType::f16:
      return w.bits == 8 ? packed_matmul_typed<8, SourceType::f16>(w, x, n, y, ldy, p0, p1)
                         : packed_matmul_typed<4, SourceType::f16>(w, x, n, y, ldy, p0, p1);
    case SourceType::bf16:
      return w.bits == 8 ? packed_matmul_typed<8, SourceType::bf16>(w, x, n, y, ldy, p0, p1)
                         : packed_matmul_typed<4, SourceType::bf16>(w, x, n, y, ldy, p0, p1);
    case SourceType::f32:
      return w.bits == 8 ? packed_matmul_typed<8, SourceType::f32>(w, x, n, y, ldy, p0, p1)
                         : packed_matmul_typed<4, SourceType::f32>(w, x, n, y, ldy, p0, p1);
  }
}

void packed_matvec_avx512(const PackedView& w, const QuantizedRow& x, float* y, int64_t p0, int64_t p1) {
  packed_matmul_avx512(w, &x, 1, y, 0, p0, p1);
}

// 16 dense weights at column c of row `row` widened to f32; `mask` selects the valid tail lanes.
template <WeightFormat F>
inline __m512 load_dense16(const void* w, int64_t index, __mmask16 mask) {
  if constexpr (F == WeightFormat::f32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(w) + index);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(w) + index);
    if constexpr (F == WeightFormat::f16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <WeightFormat F>
void dense_matvec_typed(const void* w, int64_t cols, const float* x, float* y, int64_t r0, int64_t r1) {
  const int64_t full = cols / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols - full)) - 1);
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
           acc3 = _mm512_setzero_ps();
    constexpr int64_t elem = F == WeightFormat::f32 ? 4 : 2;
    const char* rows_base = static_cast<const char*>(w) + r * cols * elem;
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 mask = c < full ? static_cast<__mmask16>(0xFFFF) : tail;
      if ((c * elem) % 64 == 0) {
        for (int i = 0; i < 4; ++i)
          _mm_prefetch(rows_base + (4 + i) * cols * elem + c * elem, _MM_HINT_T0);  // the next 4-row group
      }
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + c);
      acc0 = _mm512_fmadd_ps(load_dense16<F>(w, (r + 0) * cols + c, mask), xv, acc0);
      acc1 = _mm512_fmadd_ps(load_dense16<F>(w, (r + 1) * cols + c, mask), xv, acc1);
      acc2 = _mm512_fmadd_ps(load_dense16<F>(w, (r + 2) * cols + c, mask), xv, acc2);
      acc3 = _mm512_fmadd_ps(load_dense16<F>(w, (r + 3) * cols + c, mask), xv, acc3);
    }
    y[r + 0] = _mm512_reduce_add_ps(acc0);
    y[r + 1] = _mm512_reduce_add_ps(acc1);
    y[r + 2] = _mm512_reduce_add_ps(acc2);
    y[r + 3] = _mm512_reduce_add_ps(acc3);
  }
  for (; r < r1; ++r) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 mask = c < full ? static_cast<__mmask16>(0xFFFF) : tail;
      acc = _mm512_fmadd_ps(load_dense16<F>(w, r * cols + c, mask), _mm512_maskz_loadu_ps(mask, x + c), acc);
    }
    y[r] = _mm512_reduce_add_ps(acc);
  }
}

void dense_matvec_avx512(WeightFormat f, const void* w, int64_t cols, const float* x, float* y, int64_t r0,
                         int64_t r1) {
  switch (f) {
    case WeightFormat::f16: return dense_matvec_typed<WeightFormat::f16>(w, cols, x, y, r0, r1);
    case WeightFormat::bf16: return dense_matvec_typed<WeightFormat::bf16>(w, cols, x, y, r0, r1);
    default: return dense_matvec_typed<WeightFormat::f32>(w, cols, x, y, r0, r1);
  }
}

template <WeightFormat F>
void dense_to_f32_typed(const void* w, int64_t begin, int64_t end, float* out) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 mask = end - i >= 16 ? static_cast<__mmask16>(0xFFFF)
                                         : static_cast<__mmask16>((1u << (end - i)) - 1);
    _mm512_mask_storeu_ps(out + (i - begin), mask, load_dense16<F>(w, i, mask));
  }
}

void dense_to_f32_avx512(WeightFormat f, const void* w, int64_t cols, int64_t r0, int64_t r1, float* out) {
  switch (f) {
    case WeightFormat::f16: return dense_to_f32_typed<WeightFormat::f16>(w, r0 * cols, r1 * cols, out);
    case WeightFormat::bf16: return dense_to_f32_typed<WeightFormat::bf16>(w, r0 * cols, r1 * cols, out);
    default: return dense_to_f32_typed<WeightFormat::f32>(w, r0 * cols, r1 * cols, out);
  }
}

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table{quantize_row_avx512, packed_matvec_avx512, packed_matmul_avx512, dense_matvec_avx512,
                                 dense_to_f32_avx512, dense_matmul_avx512};
  return table;
}

}  // namespace tierlm::kernels
