// matvec_batch (several matvecs in one dispatch over the pool) against matvec task by task: every output row bit for
// bit, for each weight format it takes, every ISA this CPU runs, one and three threads, and tasks of different row
// counts (the units of one task run on several threads, and one thread's range spans tasks). Mixed shapes and MXFP4
// are refused.
#include <gtest/gtest.h>

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

// An MLX affine weight of random codes, with f16 scales and biases drawn from a few exact values.
Weight mlx_weight(std::mt19937& rng, int64_t rows, int64_t cols, int bits, tiering::Ledger& ledger) {
  constexpr int group = 64;
  std::vector<uint32_t> packed(size_t(rows * cols * bits / 32));
  for (auto& p : packed) p = uint32_t(rng());
  const uint16_t values[] = {0x3C00, 0x3800, 0xB800, 0x2E66, 0xAE66};  // 1, 0.5, -0.5, ~0.1, ~-0.1
  std::vector<uint16_t> scales(size_t(rows * cols / group)), biases(scales.size());
  for (auto& s : scales) s = values[rng() % 5];
  for (auto& b : biases) b = values[rng() % 5];
  return make_mlx_weight(packed.data(), scales.data(), biases.data(), SourceType::f16, rows, cols, group, bits,
                         ledger, "weights");
}

TEST(MatvecBatch, EveryRowIsMatvecsBitForBit) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  IsaGuard guard;
  const int64_t cols = 256;
  const std::vector<int64_t> rows{37, 48, 16, 5, 70};  // partial panels, one panel, less than one
  for (WeightFormat format : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::q8_0,
                              WeightFormat::q4, WeightFormat::mlx_q4, WeightFormat::mlx_q8}) {
    ASSERT_TRUE(matvec_batch_supported(format));
    tiering::Ledger ledger;
    std::vector<Weight> weights;
    std::vector<std::vector<float>> xs;
    for (int64_t r : rows) {
      if (format == WeightFormat::mlx_q4 || format == WeightFormat::mlx_q8) {
        weights.push_back(mlx_weight(rng, r, cols, format == WeightFormat::mlx_q4 ? 4 : 8, ledger));
      } else {
        std::vector<float> src(size_t(r * cols));
        for (auto& v : src) v = normal(rng);
        weights.push_back(make_weight(src.data(), SourceType::f32, r, cols, format, ledger, "weights"));
      }
      xs.emplace_back(size_t(cols));
      for (auto& v : xs.back()) v = normal(rng);
    }
    for (Isa isa : runnable_isas()) {
      set_isa_for_testing(isa);
      for (int threads : {1, 3}) {
        ThreadPool pool(threads, false);
        std::vector<std::vector<float>> one(rows.size()), together(rows.size());
        std::vector<MatvecTask> tasks;
        for (size_t t = 0; t < rows.size(); ++t) {
          one[t].assign(size_t(rows[t]), NAN);
          together[t].assign(size_t(rows[t]), NAN);
          matvec(weights[t].view, xs[t].data(), one[t].data(), pool);
          tasks.push_back({&weights[t].view, xs[t].data(), together[t].data()});
        }
        matvec_batch(tasks, pool);
        for (size_t t = 0; t < rows.size(); ++t)
          EXPECT_EQ(one[t], together[t]) << format_name(format) << " " << isa_name(isa) << " threads " << threads
                                         << " task " << t;
      }
    }
  }
}

// More tasks than matvec_batch keeps on its stack (32): the same sums.
TEST(MatvecBatch, ManyTasksAreMatvecsBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  tiering::Ledger ledger;
  const int64_t rows = 24, cols = 64;
  std::vector<Weight> weights;
  std::vector<std::vector<float>> xs, one, together;
  for (int t = 0; t < 40; ++t) {
    std::vector<float> src(size_t(rows * cols));
    for (auto& v : src) v = normal(rng);
    weights.push_back(make_weight(src.data(), SourceType::f32, rows, cols, WeightFormat::q8_0, ledger, "weights"));
    xs.emplace_back(size_t(cols));
    for (auto& v : xs.back()) v = normal(rng);
  }
  ThreadPool pool(3, false);
  std::vector<MatvecTask> tasks;
  for (size_t t = 0; t < weights.size(); ++t) {
    one.emplace_back(size_t(rows), NAN);
    together.emplace_back(size_t(rows), NAN);
    matvec(weights[t].view, xs[t].data(), one[t].data(), pool);
  }
  for (size_t t = 0; t < weights.size(); ++t) tasks.push_back({&weights[t].view, xs[t].data(), together[t].data()});
  matvec_batch(tasks, pool);
  EXPECT_EQ(one, together);
}

TEST(MatvecBatch, RefusesMixedShapesAndMxfp4) {
  tiering::Ledger ledger;
  std::vector<float> src(64 * 128, 0.5f), x(256, 1.0f), y(64);
  const Weight a = make_weight(src.data(), SourceType::f32, 64, 128, WeightFormat::q8_0, ledger, "w");
  const Weight b = make_weight(src.data(), SourceType::f32, 32, 256, WeightFormat::q8_0, ledger, "w");
  const Weight c = make_weight(src.data(), SourceType::f32, 64, 128, WeightFormat::q4, ledger, "w");
  ThreadPool pool(2, false);
  const std::vector<MatvecTask> shapes{{&a.view, x.data(), y.data()}, {&b.view, x.data(), y.data()}};
  EXPECT_THROW(matvec_batch(shapes, pool), std::invalid_argument);
  const std::vector<MatvecTask> formats{{&a.view, x.data(), y.data()}, {&c.view, x.data(), y.data()}};
  EXPECT_THROW(matvec_batch(formats, pool), std::invalid_argument);
  EXPECT_FALSE(matvec_batch_supported(WeightFormat::mxfp4));
  matvec_batch({}, pool);  // nothing to do
}

}  // namespace
}  // namespace tierlm::kernels
