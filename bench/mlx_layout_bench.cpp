// bench/mlx_layout_bench.cpp — the numbers behind the expert slot layout of MLX experts (docs: bench/results/
// mlx-slot.md): decode matvec GB/s of a Qwen3-30B-A3B expert (gate_up [1536 x 2048], down [2048 x 768], 4-bit,
// group 64, bf16 scales and biases) on the panel layout tierlm's kernels use (layout 0, kernels::matvec, one thread)
// and on MLX's own row-major bytes (layout 1: a prototype AVX-512 kernel written here only to measure whether the
// re-layout is needed for speed: codes unpacked per 64-column group against an even/odd-split activation, one
// horizontal sum per row), and the cost of the re-layout itself (kernels::pack_mlx_rows, MLX bytes -> slot) per
// expert. Matvec cycles through 64 experts (170 MB) so every call streams from DRAM, as a miss's fresh slot does.
// Run: build/bench/mlx_layout_bench --benchmark_counters_tabular=true
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* temporaries (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/mlx_repack.h"
#include "runtime/kernels/weights.h"

namespace tk = tierlm::kernels;

namespace {

constexpr int64_t kHidden = 2048, kInter = 768, kGroup = 64, kExperts = 64;

// One matrix as MLX stores it: uint32 words [rows, cols/8], bf16 scales and biases [rows, cols/64].
struct MlxMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales, biases;
};

MlxMatrix random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  MlxMatrix m{rows, cols, std::vector<uint32_t>(size_t(rows * cols / 8)), std::vector<uint16_t>(size_t(rows * cols / kGroup)), {}};
  m.biases.resize(m.scales.size());
  uint64_t s = 0x9E3779B97F4A7C15ull ^ seed;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (auto& w : m.words) w = uint32_t(next());
  for (size_t i = 0; i < m.scales.size(); ++i) {
    m.scales[i] = tk::f32_to_bf16(0.0005f + 0.0015f * float(next() & 0xFFFF) / 65536.0f);
    m.biases[i] = tk::f32_to_bf16(0.04f * float(next() & 0xFFFF) / 65536.0f - 0.02f);
  }
  return m;
}

uint64_t mlx_bytes(const MlxMatrix& m) { return m.words.size() * 4 + m.scales.size() * 4; }

struct Expert {
  MlxMatrix gate_up, down;
};

const std::vector<Expert>& experts() {
  static const std::vector<Expert> all = [] {
    std::vector<Expert> v;
    for (int64_t e = 0; e < kExperts; ++e)
      v.push_back({random_matrix(2 * kInter, kHidden, 2 * e), random_matrix(kHidden, kInter, 2 * e + 1)});
    return v;
  }();
  return all;
}

tierlm::tiering::Ledger& ledger() {
  static tierlm::tiering::Ledger l;
  return l;
}

// Layout 1: y[r] = sum_g d * (codes . x) + m * sum(x_g) straight from MLX's row-major words. x_split holds each
// 64-column group's activations as [even columns (32) | odd columns (32)], matching a 32-byte group whose byte i
// holds columns 2i (low nibble) and 2i+1 (high nibble).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void row_major_matvec(
    const MlxMatrix& w, const float* x_split, const float* gsum, float* y) {
  const int64_t groups = w.cols / kGroup;
  const auto* bytes = reinterpret_cast<const uint8_t*>(w.words.data());
  const __m128i low_mask = _mm_set1_epi8(0x0F);
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = bytes + r * (w.cols / 2);
    __m512 acc_row = _mm512_setzero_ps();
    float bias_row = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* q = row + g * 32;
      _mm_prefetch(reinterpret_cast<const char*>(q + 2048), _MM_HINT_T0);
      const float* xs = x_split + g * kGroup;
      __m512 acc = _mm512_setzero_ps();
      for (int half = 0; half < 2; ++half) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + half * 16));
        const __m128i lo = _mm_and_si128(v, low_mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low_mask);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_loadu_ps(xs + half * 16), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), _mm512_loadu_ps(xs + 32 + half * 16), acc);
      }
      const size_t s = size_t(r * groups + g);
      acc_row = _mm512_fmadd_ps(_mm512_set1_ps(tk::bf16_to_f32(w.scales[s])), acc, acc_row);
      bias_row += tk::bf16_to_f32(w.biases[s]) * gsum[g];
    }
    y[r] = _mm512_reduce_add_ps(acc_row) + bias_row;
  }
}

void split_even_odd(const float* x, int64_t cols, float* out) {
  for (int64_t g = 0; g < cols / kGroup; ++g)
    for (int i = 0; i < 32; ++i) {
      out[g * kGroup + i] = x[g * kGroup + 2 * i];
      out[g * kGroup + 32 + i] = x[g * kGroup + 2 * i + 1];
    }
}

std::vector<float> activation(int64_t cols) {
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) x[size_t(c)] = std::sin(0.37f * float(c));
  return x;
}

std::vector<float> group_sums(const std::vector<float>& x) {
  std::vector<float> s(x.size() / kGroup, 0.0f);
  for (size_t c = 0; c < x.size(); ++c) s[c / kGroup] += x[c];
  return s;
}

void BM_ExpertMatvec(benchmark::State& state) {
  const bool row_major = state.range(0) == 1;
  if (row_major && !__builtin_cpu_supports("avx512f")) return state.SkipWithError("needs AVX-512");
  const auto& all = experts();
  const auto xh = activation(kHidden), xi = activation(kInter);
  std::vector<float> xh_split(xh.size()), xi_split(xi.size());
  split_even_odd(xh.data(), kHidden, xh_split.data());
  split_even_odd(xi.data(), kInter, xi_split.data());
  const auto gh = group_sums(xh), gi = group_sums(xi);
  std::vector<tk::Weight> packed;
  if (!row_major)
    for (const Expert& e : all)
      for (const MlxMatrix* m : {&e.gate_up, &e.down})
        packed.push_back(tk::make_mlx_weight(m->words.data(), m->scales.data(), m->biases.data(), tk::SourceType::bf16,
                                             m->rows, m->cols, kGroup, 4, ledger(), "weights"));
  tk::ThreadPool pool(1);
  std::vector<float> y(size_t(std::max(2 * kInter, kHidden))), y_check(size_t(2 * kInter));
  // Both layouts compute the same expert: the first gate_up rows agree to f32 rounding.
  {
    const tk::Weight w = tk::make_mlx_weight(all[0].gate_up.words.data(), all[0].gate_up.scales.data(),
                                             all[0].gate_up.biases.data(), tk::SourceType::bf16, 2 * kInter, kHidden,
                                             kGroup, 4, ledger(), "weights");
    tk::matvec(w.view, xh.data(), y_check.data(), pool);
    if (__builtin_cpu_supports("avx512f")) {
      row_major_matvec(all[0].gate_up, xh_split.data(), gh.data(), y.data());
      for (size_t r = 0; r < y_check.size(); ++r)
        if (std::fabs(y[r] - y_check[r]) > 1e-4f * (1.0f + std::fabs(y_check[r])))
          return state.SkipWithError("row-major prototype disagrees with the panel kernel");
    }
  }
  size_t e = 0;
  uint64_t bytes = 0;
  for (auto _ : state) {
    const Expert& ex = all[e];
    if (row_major) {
      row_major_matvec(ex.gate_up, xh_split.data(), gh.data(), y.data());
      row_major_matvec(ex.down, xi_split.data(), gi.data(), y.data());
    } else {
      tk::matvec(packed[2 * e].view, xh.data(), y.data(), pool);
      tk::matvec(packed[2 * e + 1].view, xi.data(), y.data(), pool);
    }
    benchmark::DoNotOptimize(y.data());
    bytes += mlx_bytes(ex.gate_up) + mlx_bytes(ex.down);
    e = (e + 1) % all.size();
  }
  state.SetBytesProcessed(int64_t(bytes));
  state.SetLabel(row_major ? "MLX row-major (prototype)" : "panel (tierlm kernel)");
}

// The re-layout a miss does: one expert's nine MLX tensors into a slot-shaped block (pack_mlx_rows).
void BM_ExpertRepack(benchmark::State& state) {
  const auto& all = experts();
  tk::WeightView gu_view{tk::WeightFormat::mlx_q4, 2 * kInter, kHidden, nullptr, nullptr, nullptr,
                         tk::SourceType::bf16, int(kGroup), 4};
  tk::WeightView d_view = gu_view;
  d_view.rows = kHidden;
  d_view.cols = kInter;
  const uint64_t gu_bytes = tk::weight_bytes(gu_view), d_bytes = tk::weight_bytes(d_view);
  std::vector<uint8_t> slot(size_t(gu_bytes + d_bytes));
  const uint64_t gu_data = uint64_t(2 * kInter * kHidden / 2), gu_scales = uint64_t(2 * kInter * kHidden / kGroup) * 2;
  const uint64_t d_data = uint64_t(kHidden * kInter / 2), d_scales = uint64_t(kHidden * kInter / kGroup) * 2;
  uint8_t* base = slot.data();
  const tk::MlxPackTarget gu{base, base + gu_data, base + gu_data + gu_scales, 2 * kInter, 0};
  const tk::MlxPackTarget d{base + gu_bytes, base + gu_bytes + d_data, base + gu_bytes + d_data + d_scales, kHidden, 0};
  size_t e = 0;
  uint64_t bytes = 0;
  for (auto _ : state) {
    const Expert& ex = all[e];
    tk::pack_mlx_rows(ex.gate_up.words.data(), ex.gate_up.scales.data(), ex.gate_up.biases.data(),
                      tk::SourceType::bf16, 2 * kInter, kHidden, int(kGroup), 4, gu);
    tk::pack_mlx_rows(ex.down.words.data(), ex.down.scales.data(), ex.down.biases.data(), tk::SourceType::bf16,
                      kHidden, kInter, int(kGroup), 4, d);
    benchmark::DoNotOptimize(slot.data());
    bytes += mlx_bytes(ex.gate_up) + mlx_bytes(ex.down);
    e = (e + 1) % all.size();
  }
  state.SetBytesProcessed(int64_t(bytes));
}

}  // namespace

BENCHMARK(BM_ExpertMatvec)->ArgName("layout")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_ExpertRepack)->Unit(benchmark::kMicrosecond)->MinTime(1.0)->UseRealTime();
BENCHMARK_MAIN();
