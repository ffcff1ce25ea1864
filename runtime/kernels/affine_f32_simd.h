// runtime/kernels/affine_f32_simd.h — internal: the float-activation affine kernel (affine_f32.h) written once over a
// vector type, instantiated by affine_f32_avx512.cpp (16 rows a vector) and affine_f32_avx2.cpp (8 rows, two halves
// of a panel). The math is affine_f32_scalar's.
// Never: included outside those two files (the vector types need their ISA flags).
//
// A 64-byte quad holds 16 rows x 4 columns (row r in 32-bit lane r), so column j of the quad is lane-wise
// (v >> 8j) & 0xFF (4-bit: the low nibbles hold one quad, the high nibbles the quad 16 columns further on): a shift, a
// mask and an int->float convert give a vector of rows' codes of a column as floats, which FMAs against the broadcast
// activation. A quad's 4 columns are summed in a fixed order (x0, + x1, + x2, + x3) and added to the row's group sum,
// the same for every tile size, so a row's result does not depend on how many activation rows are multiplied with it
// (decode, chunked prefill and batches agree bit for bit), and decode's only loop-carried dependency is one add per
// quad. Per group the sum is scaled once (d) and the bias term m * sum(x) added, as MLX's own kernels do.
//
// A vector type V provides: F (float vector), I (int vector), kRows (rows a vector holds), kMaxTile (activation rows
// per tile), load(p) (a vector's bytes of a quad), code<Shift, Bits>(v), zero(), set1(f), mul, fma(a, b, c) = a*b+c,
// add, scales<ST>(base, index) (kRows group scales widened) and store(y, v, valid) (the first `valid` rows).
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/kernels/affine_f32.h"

namespace tierlm::kernels::affine_simd {

// Decode streams each weight once; prefetching ahead keeps more DRAM requests in flight (as kernels_avx512.cpp).
inline constexpr int kPrefetchBytes = 4096;

template <class V>
inline typename V::F quad_dot(const typename V::F (&wf)[4], const float* x) {
  typename V::F s = V::mul(wf[0], V::set1(x[0]));
  s = V::fma(wf[1], V::set1(x[1]), s);
  s = V::fma(wf[2], V::set1(x[2]), s);
  return V::fma(wf[3], V::set1(x[3]), s);
}

// Rows [slice*kRows, (slice+1)*kRows) of panel p against T activation rows.
template <class V, int T, int Bits, SourceType ST>
inline void tile(const PackedView& w, int64_t p, int slice, const float* x, const float* gsum, float* y, int64_t ldy) {
  using F = typename V::F;
  const uint8_t* panel = w.data + p * w.panel_bytes() + slice * V::kRows * 4;
  const int64_t groups = w.groups(), cols = w.cols;
  F yacc[T];
  for (int t = 0; t < T; ++t) yacc[t] = V::zero();
  for (int64_t g = 0; g < groups; ++g) {
    F acc[T];
    for (int t = 0; t < T; ++t) acc[t] = V::zero();
    const int64_t c0 = g * w.group, c1 = c0 + w.group;
    if constexpr (Bits == 8) {
      for (int64_t quad = c0 / 4; quad < c1 / 4; ++quad) {
        const uint8_t* q = panel + quad * 64;
        if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
        const auto v = V::load(q);
        const F wf[4] = {V::template code<0, 8>(v), V::template code<8, 8>(v), V::template code<16, 8>(v),
                         V::template code<24, 8>(v)};
        for (int t = 0; t < T; ++t) acc[t] = V::add(acc[t], quad_dot<V>(wf, x + t * cols + quad * 4));
      }
    } else {
      for (int64_t block = c0 / 32; block < c1 / 32; ++block) {
        for (int c = 0; c < 4; ++c) {
          const uint8_t* q = panel + block * 256 + c * 64;
          if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetchBytes), _MM_HINT_T0);
          const auto v = V::load(q);
          const float* xc = x + block * 32 + c * 4;
          const F lo[4] = {V::template code<0, 4>(v), V::template code<8, 4>(v), V::template code<16, 4>(v),
                           V::template code<24, 4>(v)};
          for (int t = 0; t < T; ++t) acc[t] = V::add(acc[t], quad_dot<V>(lo, xc + t * cols));
          const F hi[4] = {V::template code<4, 4>(v), V::template code<12, 4>(v), V::template code<20, 4>(v),
                           V::template code<28, 4>(v)};
          for (int t = 0; t < T; ++t) acc[t] = V::add(acc[t], quad_dot<V>(hi, xc + t * cols + 16));
        }
      }
    }
    const int64_t si = (p * groups + g) * kPanelRows + slice * V::kRows;
    const F d = V::template scales<ST>(w.d, si), m = V::template scales<ST>(w.m, si);
    for (int t = 0; t < T; ++t) {
      yacc[t] = V::fma(d, acc[t], yacc[t]);
      yacc[t] = V::fma(m, V::set1(gsum[t * groups + g]), yacc[t]);
    }
  }
  const int64_t row0 = p * kPanelRows + slice * V::kRows;
  const int valid = static_cast<int>(std::clamp<int64_t>(w.rows - row0, 0, V::kRows));
  for (int t = 0; t < T; ++t) V::store(y + t * ldy + row0, yacc[t], valid);
}

// step(integral_constant<int, r>) for r = rows, 0 < rows <= R.
template <int R, class Step>
inline void tail(int64_t rows, Step& step) {
  if constexpr (R > 0) {
    if (rows == R) return step(std::integral_constant<int, R>{});
    tail<R - 1>(rows, step);
  }
}

template <class V, int Bits, SourceType ST>
void run(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy, int64_t p0,
         int64_t p1) {
  const int64_t groups = w.groups(), cols = w.cols;
  for (int64_t p = p0; p < p1; ++p) {
    for (int slice = 0; slice < kPanelRows / V::kRows; ++slice) {
      if (p * kPanelRows + slice * V::kRows >= w.rows) break;
      int64_t i = 0;
      auto step = [&](auto rows) {
        constexpr int kT = decltype(rows)::value;
        tile<V, kT, Bits, ST>(w, p, slice, x + i * cols, gsum + i * groups, y + i * ldy, ldy);
        i += kT;
      };
      while (n - i >= V::kMaxTile) step(std::integral_constant<int, V::kMaxTile>{});
      // The tail (fewer rows than a full tile) in one pass: each pass unpacks the slice's codes again.
      tail<V::kMaxTile - 1>(n - i, step);
    }
  }
}

// The kernel of affine_f32.h over vector type V.
template <class V>
void multiply(const PackedView& w, const float* x, const float* gsum, int64_t n, float* y, int64_t ldy, int64_t p0,
              int64_t p1) {
  switch (w.scale_type) {
    case SourceType::f16:
      return w.bits == 8 ? run<V, 8, SourceType::f16>(w, x, gsum, n, y, ldy, p0, p1)
                         : run<V, 4, SourceType::f16>(w, x, gsum, n, y, ldy, p0, p1);
    case SourceType::bf16:
      return w.bits == 8 ? run<V, 8, SourceType::bf16>(w, x, gsum, n, y, ldy, p0, p1)
                         : run<V, 4, SourceType::bf16>(w, x, gsum, n, y, ldy, p0, p1);
    case SourceType::f32:
      return w.bits == 8 ? run<V, 8, SourceType::f32>(w, x, gsum, n, y, ldy, p0, p1)
                         : run<V, 4, SourceType::f32>(w, x, gsum, n, y, ldy, p0, p1);
  }
}

}  // namespace tierlm::kernels::affine_simd
