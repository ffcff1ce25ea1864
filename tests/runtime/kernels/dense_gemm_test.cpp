// The prefill GEMM over dense f32/f16/bf16 weights (matmul with more rows than the small-batch path takes), on every
// ISA, against exact math: each output is compared with the double-precision product of the widened weights and
// the activations, within the worst-case bound of an f32 dot product of that length (gamma_K * sum |x w|). Shapes
// cover partial register tiles (activation rows not a multiple of 12, weight rows not a multiple of 32/64), a
// shared dimension spanning several packed depths with a ragged tail, and thread counts that split activation
// rows into groups.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/kernel_isa.h"
#include "tests/runtime/kernels/isa_test_util.h"
#include "runtime/kernels/weights.h"

namespace tierlm::kernels {
namespace {

using isa_testing::IsaGuard;
using isa_testing::runnable_isas;

void check_matmul(WeightFormat format, int64_t rows, int64_t cols, int64_t n, int threads, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(n * cols));
  for (auto& v : src) v = normal(rng);
  for (auto& v : x) v = normal(rng);
  tiering::Ledger ledger;
  const Weight w = make_weight(src.data(), SourceType::f32, rows, cols, format, ledger, "weights");
  std::vector<float> widened(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row(w.view, r, widened.data() + r * cols);
  ThreadPool pool(threads, false);
  constexpr double unit_roundoff = 1.0 / (1 << 24);
  const double gamma = double(cols + 2) * unit_roundoff / (1 - double(cols + 2) * unit_roundoff);
  for (Isa isa : runnable_isas()) {
    set_isa_for_testing(isa);
    std::vector<float> y(static_cast<size_t>(n * rows), NAN);
    matmul(w.view, x.data(), n, y.data(), pool);
    int failures = 0;
    for (int64_t i = 0; i < n && failures < 5; ++i) {
      for (int64_t r = 0; r < rows && failures < 5; ++r) {
        double exact = 0, magnitude = 0;
        for (int64_t k = 0; k < cols; ++k) {
          const double p = double(x[i * cols + k]) * double(widened[r * cols + k]);
          exact += p;
          magnitude += std::fabs(p);
        }
        const double got = y[i * rows + r];
        if (!(std::fabs(got - exact) <= gamma * magnitude)) {
          ADD_FAILURE() << format_name(format) << " " << isa_name(isa) << " rows " << rows << " cols " << cols << " n "
                        << n << " threads " << threads << ": Y[" << i << "][" << r << "] = " << got << ", exact "
                        << exact << " (bound " << gamma * magnitude << ")";
          ++failures;
        }
      }
    }
  }
}

TEST(DenseGemm, MatchesExactProductAcrossShapesThreadsAndIsas) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  IsaGuard guard;
  for (WeightFormat format : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16}) {
    check_matmul(format, 97, 600, 37, 1, rng);   // 3 packed depths (256, 256, 88), partial tiles both ways
    check_matmul(format, 130, 300, 131, 3, rng);  // 3 weight blocks on 3 threads: activation rows split in groups
    check_matmul(format, 64, 16, 17, 2, rng);     // one exact block, one short depth, just past the small batch
    check_matmul(format, 5, 33, 29, 2, rng);      // fewer weight rows than one vector
  }
}

TEST(DenseGemm, EveryOutputWrittenOnceWithoutAccumulatingStaleValues) {
  // The GEMM overwrites Y (beta = 0): garbage already in Y must not leak into the result.
  std::mt19937 rng(7);
  IsaGuard guard;
  const int64_t rows = 70, cols = 520, n = 25;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(n * cols));
  for (auto& v : src) v = normal(rng);
  for (auto& v : x) v = normal(rng);
  tiering::Ledger ledger;
  ThreadPool pool(2, false);
  for (WeightFormat format : {WeightFormat::f32, WeightFormat::f16}) {
    const Weight w = make_weight(src.data(), SourceType::f32, rows, cols, format, ledger, "weights");
    for (Isa isa : runnable_isas()) {
      set_isa_for_testing(isa);
      std::vector<float> clean(static_cast<size_t>(n * rows), 0.0f), dirty(static_cast<size_t>(n * rows), 1e30f);
      matmul(w.view, x.data(), n, clean.data(), pool);
      matmul(w.view, x.data(), n, dirty.data(), pool);
      EXPECT_EQ(clean, dirty) << format_name(format) << " " << isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace tierlm::kernels
