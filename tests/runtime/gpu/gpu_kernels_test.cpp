// The CUDA decode kernels one at a time against plain double-precision math on the host, on the shapes the models
// use (the tiny default model, the llama-1B bench shape) and odd ones: the f16/bf16 decode matvec (x as is, with the
// RMSNorm fused into its load, with the SiLU gate fused), the few-row matvec (2-4 x rows) and the packed q8_0 one;
// the device embedding lookup against the host's (kernels::dequantize_row) in every format, and the device greedy
// argmax against engine::argmax (ties, NaN, a vocabulary that does not split evenly).
// The inputs are exactly representable in the weight format, so the only difference is f32 summation order.
// Without a GPU every test skips with the reason.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "runtime/engine/sampler.h"
#include "runtime/gpu/device_kernels.cuh"
#include "runtime/kernels/weights.h"
#include "runtime/kernels/thread_pool.h"
#include "tiering/ledger.h"
#include "runtime/gpu/gpu_probe.h"
#include "tests/runtime/gpu/skip_without_gpu.h"

using namespace tierlm;
using gpu::device::MatrixRef;

namespace {

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);  // the inputs below have at most 8 significant bits: exact
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Device buffer of T, freed at scope end.
template <class T>
struct Device {
  T* p = nullptr;
  explicit Device(const std::vector<T>& host) {
    EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
    cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~Device() { cudaFree(p); }
  std::vector<T> get(size_t n) const {
    std::vector<T> out(n);
    cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
};

// Values k / 64 for k in [-64, 64]: exact in bf16 and f16, products exact in f32.
std::vector<float> values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-64, 64);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng)) / 64.0f;
  return v;
}

double max_relative(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / std::max(den, 1e-30);
}

struct Shape {
  int64_t rows, cols;
};

class DenseDecode : public ::testing::TestWithParam<Shape> {};

// y = W x, y += W rmsnorm(x), y = W (silu(g) * u), for bf16 weights, through the n == 1 decode kernels.
TEST_P(DenseDecode, MatchesHostMath) {
  SKIP_WITHOUT_GPU();
  const auto [rows, cols] = GetParam();
  const std::vector<float> wf = values(size_t(rows * cols), 1), xf = values(size_t(2 * cols), 2),
                           nf = values(size_t(cols), 3), y0 = values(size_t(rows), 4);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = to_bf16(wf[i]);
  Device<uint16_t> w(wb);
  Device<float> x(xf), norm(nf), y(y0);
  MatrixRef m;
  m.format = 2;
  m.rows = rows;
  m.cols = cols;
  m.data = w.p;
  ASSERT_TRUE(gpu::device::dense_fusable(m));
  auto dot = [&](int64_t r, const std::vector<double>& v) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += double(from_bf16(wb[size_t(r * cols + c)])) * v[size_t(c)];
    return s;
  };
  // 1. plain, overwrite.
  std::vector<double> xv(xf.begin(), xf.begin() + cols), want(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) want[size_t(r)] = dot(r, xv);
  gpu::device::matvec(m, x.p, cols, 1, y.p, rows, false, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(max_relative(y.get(size_t(rows)), want), 1e-5) << "plain " << rows << "x" << cols;
  // 2. normed, accumulate onto y.
  double squares = 0;
  for (int64_t c = 0; c < cols; ++c) squares += double(xf[size_t(c)]) * xf[size_t(c)];
  const double inv = 1.0 / std::sqrt(squares / double(cols) + 1e-6);
  std::vector<double> xn(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) xn[size_t(c)] = double(nf[size_t(c)]) * (double(xf[size_t(c)]) * inv);
  const std::vector<float> before = y.get(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) want[size_t(r)] = double(before[size_t(r)]) + dot(r, xn);
  gpu::device::matvec_normed(m, x.p, norm.p, 1e-6f, y.p, true, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(max_relative(y.get(size_t(rows)), want), 1e-5) << "normed " << rows << "x" << cols;
  // 3. gated: x is [gate | up] of 2 * cols.
  std::vector<double> act(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    const double g = xf[size_t(c)], u = xf[size_t(cols + c)];
    act[size_t(c)] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t r = 0; r < rows; ++r) want[size_t(r)] = dot(r, act);
  gpu::device::matvec_gated(m, x.p, y.p, false, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(max_relative(y.get(size_t(rows)), want), 1e-5) << "gated " << rows << "x" << cols;
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseDecode,
                         ::testing::Values(Shape{512, 256}, Shape{1536, 256}, Shape{256, 768}, Shape{2048, 256},
                                           Shape{3072, 2048}, Shape{2048, 8192}, Shape{1057, 2048}, Shape{7, 64},
                                           Shape{300, 4104}));

// 2-4 x rows of bf16 and f32 weights (dense_matvec), and one x row of f32 weights.
TEST(FewRowMatvec, MatchesHostMath) {
  SKIP_WITHOUT_GPU();
  for (int format : {0, 2})
    for (const Shape s : {Shape{512, 256}, Shape{256, 768}, Shape{100, 72}})
      for (int64_t n = 1; n <= 4; ++n) {
        if (format == 2 && n == 1) continue;  // the decode kernels above
        const std::vector<float> wf = values(size_t(s.rows * s.cols), 5), xf = values(size_t(n * s.cols), 6);
        std::vector<uint16_t> wb(wf.size());
        for (size_t i = 0; i < wf.size(); ++i) wb[i] = to_bf16(wf[i]);
        Device<float> wf_dev(wf), x(xf), y(std::vector<float>(size_t(n * s.rows), 0.0f));
        Device<uint16_t> wb_dev(wb);
        MatrixRef m;
        m.format = format;
        m.rows = s.rows;
        m.cols = s.cols;
        m.data = format == 0 ? static_cast<const void*>(wf_dev.p) : static_cast<const void*>(wb_dev.p);
        gpu::device::matvec(m, x.p, s.cols, n, y.p, s.rows, false, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<double> want(static_cast<size_t>(n * s.rows));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < s.rows; ++r) {
            double acc = 0;
            for (int64_t c = 0; c < s.cols; ++c) acc += double(wf[size_t(r * s.cols + c)]) * xf[size_t(i * s.cols + c)];
            want[size_t(i * s.rows + r)] = acc;
          }
        EXPECT_LE(max_relative(y.get(want.size()), want), 1e-5)
            << "format " << format << " " << s.rows << "x" << s.cols << " n=" << n;
      }
}

// The packed (q8_0, q4) decode matvec, plain and with the RMSNorm or the SiLU gate fused into its x staging, against
// double math on the dequantized weights: y = W x, y = W rmsnorm(x) * w_norm, and y += W (silu(g) * u); row counts
// that leave a partial panel, both block shapes of the CUDA-core kernel (few panels: 32 warps; many: 8), and a
// 14336-column gated row (Llama-3-8B's intermediate size: 56 KiB of staged x, past the 48 KiB a kernel gets without
// asking); each on the tensor-core kernel (x split into f16 hi + lo) and on the CUDA-core one.
TEST(PackedFusedDecode, MatchesHostMath) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  using kernels::WeightFormat;
  for (WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4})
    for (const Shape s : {Shape{300, 2048}, Shape{4300, 512}, Shape{200, 8192}, Shape{64, 14336}})
      for (int mode : {0, 1, 2})
        for (bool mma : {true, false}) {
          std::vector<float> table(size_t(s.rows * s.cols));
          for (float& v : table) v = d(rng) * 0.05f;
          tiering::Ledger ledger;
          const kernels::Weight w =
              kernels::make_weight(table.data(), kernels::SourceType::f32, s.rows, s.cols, f, ledger, "w");
          auto bytes = [](const tiering::LedgerBuffer& b) {
            return b.empty() ? std::vector<uint8_t>(1)
                             : std::vector<uint8_t>(b.as<uint8_t>(), b.as<uint8_t>() + b.size());
          };
          const Device<uint8_t> data(bytes(w.data)), scales(bytes(w.scales)), biases(bytes(w.biases));
          std::vector<float> x(size_t(mode == 2 ? 2 * s.cols : s.cols)), norm(size_t(s.cols)), y0(size_t(s.rows));
          for (float& v : x) v = d(rng);
          for (float& v : norm) v = 1.0f + 0.1f * d(rng);
          for (float& v : y0) v = d(rng);
          MatrixRef m;
          m.format = int(f);
          m.rows = s.rows;
          m.cols = s.cols;
          m.data = data.p;
          m.scales = scales.p;
          m.biases = w.view.biases ? biases.p : nullptr;
          m.scale_type = 1;
          m.group_size = w.view.group_size;
          m.bits = w.view.bits;
          ASSERT_TRUE(gpu::device::decode_fusable(m));
          gpu::device::set_packed_mma(mma, /*four_bit=*/true);
          ASSERT_EQ(gpu::device::packed_mma_takes(m), mma);
          const Device<float> xd(x), nd(norm);
          Device<float> yd(y0);
          const float eps = 1e-5f;
          if (mode == 0)
            gpu::device::matvec(m, xd.p, s.cols, 1, yd.p, s.rows, true, nullptr);
          else if (mode == 1)
            gpu::device::matvec_normed(m, xd.p, nd.p, eps, yd.p, false, nullptr);
          else
            gpu::device::matvec_gated(m, xd.p, yd.p, true, nullptr);
          gpu::device::set_packed_mma(true, false);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<double> xt(static_cast<size_t>(s.cols));
          if (mode == 0) {
            for (int64_t c = 0; c < s.cols; ++c) xt[size_t(c)] = x[size_t(c)];
          } else if (mode == 1) {
            double sq = 0;
            for (int64_t c = 0; c < s.cols; ++c) sq += double(x[size_t(c)]) * x[size_t(c)];
            const double inv = 1.0 / std::sqrt(sq / double(s.cols) + eps);
            for (int64_t c = 0; c < s.cols; ++c) xt[size_t(c)] = double(x[size_t(c)]) * inv * norm[size_t(c)];
          } else {
            for (int64_t c = 0; c < s.cols; ++c) {
              const double g = x[size_t(c)], u = x[size_t(s.cols + c)];
              xt[size_t(c)] = g / (1.0 + std::exp(-g)) * u;
            }
          }
          std::vector<double> want(static_cast<size_t>(s.rows));
          std::vector<float> row(static_cast<size_t>(s.cols));
          for (int64_t r = 0; r < s.rows; ++r) {
            kernels::dequantize_row(w.view, r, row.data());
            double acc = mode != 1 ? double(y0[size_t(r)]) : 0.0;
            for (int64_t c = 0; c < s.cols; ++c) acc += double(row[size_t(c)]) * xt[size_t(c)];
            want[size_t(r)] = acc;
          }
          EXPECT_LE(max_relative(yd.get(want.size()), want), 1e-4)
              << kernels::format_name(f) << " " << s.rows << "x" << s.cols
              << (mode == 0 ? " plain" : mode == 1 ? " normed" : " gated") << (mma ? " tensor cores" : " CUDA cores");
        }
}

// The device embedding lookup gives the host's rows (kernels::dequantize_row) in every weight format.
TEST(EmbedRows, MatchesHostLookup) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 40, cols = 256;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> table(size_t(rows * cols));
  for (float& x : table) x = d(rng);
  const std::vector<int32_t> tokens = {0, 17, 39, 5, 17, 16, 31};
  using kernels::WeightFormat;
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::q8_0, WeightFormat::q4}) {
    tiering::Ledger ledger;
    const kernels::Weight w = kernels::make_weight(table.data(), kernels::SourceType::f32, rows, cols, f, ledger, "w");
    auto bytes = [](const tiering::LedgerBuffer& b) {  // (one byte for a part the format does not have)
      return b.empty() ? std::vector<uint8_t>(1) : std::vector<uint8_t>(b.as<uint8_t>(), b.as<uint8_t>() + b.size());
    };
    const Device<uint8_t> data(bytes(w.data)), scales(bytes(w.scales)), biases(bytes(w.biases));
    MatrixRef m;
    m.format = int(w.view.format);
    m.rows = rows;
    m.cols = cols;
    m.data = data.p;
    m.scales = w.view.scales ? scales.p : nullptr;
    m.biases = w.view.biases ? biases.p : nullptr;
    m.scale_type = w.view.scale_type == kernels::SourceType::f32 ? 0 : w.view.scale_type == kernels::SourceType::f16 ? 1 : 2;
    m.group_size = w.view.group_size;
    m.bits = w.view.bits;
    const Device<int32_t> ids(tokens);
    Device<float> out(std::vector<float>(tokens.size() * size_t(cols), -1.0f));
    gpu::device::embed_rows(m, ids.p, int64_t(tokens.size()), out.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = out.get(tokens.size() * size_t(cols));
    double worst = 0;
    std::vector<float> want(static_cast<size_t>(cols));
    for (size_t i = 0; i < tokens.size(); ++i) {
      kernels::dequantize_row(w.view, tokens[i], want.data());
      for (int64_t c = 0; c < cols; ++c)
        worst = std::max(worst, double(std::fabs(got[i * size_t(cols) + size_t(c)] - want[size_t(c)])) /
                                    std::max(1e-6, double(std::fabs(want[size_t(c)]))));
    }
    EXPECT_LE(worst, 1e-6) << kernels::format_name(f);
  }
}

// The device greedy argmax is engine::argmax: the first index on ties (across the slices the blocks take), NaN
// skipped (a leading one too), index 0 when every value is NaN; twice in a row (its counters reset themselves).
TEST(ArgmaxRows, MatchesHostArgmax) {
  SKIP_WITHOUT_GPU();
  const int64_t vocab = 151937;  // not a multiple of the block count or the warp width
  const int64_t rows = 5;
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> logits(size_t(rows * vocab));
  for (float& x : logits) x = d(rng);
  auto row = [&](int64_t r) { return logits.data() + r * vocab; };
  row(1)[vocab - 1] = 40.0f;  // a tie between the last slice and an earlier one: the earlier index wins
  row(1)[70001] = 40.0f;
  row(1)[70000] = 39.0f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  row(2)[0] = nan;  // a leading NaN, and NaNs around the maximum
  row(2)[123] = 50.0f;
  row(2)[124] = nan;
  for (int64_t j = 0; j < vocab; ++j) row(3)[j] = nan;
  for (int64_t j = 0; j < vocab; ++j) row(4)[j] = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> want(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    want[size_t(r)] = int32_t(engine::argmax(std::span<const float>(row(r), size_t(vocab))));
  EXPECT_EQ(want[1], 70001);
  EXPECT_EQ(want[2], 123);
  EXPECT_EQ(want[3], 0);
  const Device<float> dev(logits);
  Device<uint8_t> scratch(std::vector<uint8_t>(size_t(gpu::device::argmax_scratch_bytes(rows)), 0));
  Device<int32_t> out(std::vector<int32_t>(size_t(rows), -1));
  for (int pass = 0; pass < 2; ++pass) {
    gpu::device::argmax_rows(dev.p, rows, vocab, scratch.p, rows, out.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(out.get(size_t(rows)), want) << "pass " << pass;
  }
  // One row at a time, on the counters the batch left (fewer rows than the scratch is for, as the head's last
  // pass), then all again.
  for (int64_t r = 0; r < rows; ++r) {
    gpu::device::argmax_rows(dev.p + r * vocab, 1, vocab, scratch.p, rows, out.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(out.get(1)[0], want[size_t(r)]) << "row " << r;
  }
  gpu::device::argmax_rows(dev.p, rows, vocab, scratch.p, rows, out.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out.get(size_t(rows)), want) << "after single rows";
}

// MXFP4 (gpt-oss's experts, read packed): device::mxfp4_matvec against the CPU MXFP4 kernel (kernels::matmul on
// the same packed bytes) and double-precision math over the dequantized rows, for 1, 3, 4, 7 and 33 activation rows
// (the decode rows and prefill's), with random codes and scales spanning 2^-10..2^3, a zero scale byte (the
// denormal 2^-127) included; accumulate adds to what y held.
TEST(Mxfp4Matvec, MatchesTheCpuKernel) {
  SKIP_WITHOUT_GPU();
  tiering::Ledger ledger;
  kernels::ThreadPool pool(2);
  for (const Shape s : {Shape{64, 64}, Shape{130, 2880 / 10 * 4}, Shape{256, 2048}}) {
    std::mt19937 rng(uint32_t(s.rows * 7 + s.cols));
    std::uniform_int_distribution<int> byte(0, 255), scale(117, 130);
    const int64_t groups = s.rows * s.cols / 32;
    std::vector<uint8_t> blocks(static_cast<size_t>(groups * 16)), scales(static_cast<size_t>(groups));
    for (auto& b : blocks) b = uint8_t(byte(rng));
    for (auto& x : scales) x = uint8_t(scale(rng));
    scales[3] = 0;
    const kernels::Weight w = kernels::make_mxfp4_weight(blocks.data(), scales.data(), s.rows, s.cols, ledger, "w");
    std::vector<float> dense(size_t(s.rows * s.cols));
    for (int64_t r = 0; r < s.rows; ++r) kernels::dequantize_row(w.view, r, dense.data() + r * s.cols);
    for (int64_t n : {1, 3, 4, 7, 33}) {
      const std::vector<float> x = values(size_t(n * s.cols), uint32_t(n));
      std::vector<float> cpu(size_t(n * s.rows));
      kernels::matmul(w.view, x.data(), n, cpu.data(), pool);
      std::vector<double> want(size_t(n * s.rows));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < s.rows; ++r) {
          double acc = 0;
          for (int64_t c = 0; c < s.cols; ++c) acc += double(dense[size_t(r * s.cols + c)]) * x[size_t(t * s.cols + c)];
          want[size_t(t * s.rows + r)] = 1.0 + acc;  // y starts at 1 and accumulates
        }
      Device<uint8_t> db(blocks), ds(scales);
      Device<float> dx(x), dy(std::vector<float>(size_t(n * s.rows), 1.0f));
      MatrixRef m;
      m.format = gpu::device::kMxfp4Format;
      m.rows = s.rows;
      m.cols = s.cols;
      m.data = db.p;
      m.scales = ds.p;
      m.group_size = 32;
      m.bits = 4;
      gpu::device::matvec(m, dx.p, s.cols, n, dy.p, s.rows, /*accumulate=*/true, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = dy.get(size_t(n * s.rows));
      std::vector<float> cpu_plus_one(cpu);
      for (float& v : cpu_plus_one) v += 1.0f;
      std::vector<double> cpu_d(cpu_plus_one.begin(), cpu_plus_one.end());
      const double vs_math = max_relative(got, want), vs_cpu = max_relative(got, cpu_d);
      EXPECT_LE(vs_math, 1e-5) << s.rows << "x" << s.cols << " n " << n;
      EXPECT_LE(vs_cpu, 1e-5) << s.rows << "x" << s.cols << " n " << n;
      if (n == 33)
        std::printf("[ MXFP4    ] %lldx%lld: vs double math %.3g, vs the CPU MXFP4 kernel %.3g\n", (long long)s.rows,
                    (long long)s.cols, vs_math, vs_cpu);
    }
  }
}

}  // namespace
