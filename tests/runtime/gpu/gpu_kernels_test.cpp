// The CUDA decode kernels one at a time against plain double-precision math on the host, on the shapes the models
// use (the tiny default model, the llama-1B bench shape) and odd ones: the f16/bf16 decode matvec (x as is, with the
// RMSNorm fused into its load, with the SiLU gate fused), the few-row matvec (2-4 x rows) and the packed q8_0 one;
// the device embedding lookup against the host's (kernels::dequantize_row) in every format, and the device greedy
// argmax against engine::argmax (ties, NaN, a vocabulary that does not split evenly); DeepSeek's MLA kernels (latent
// store, absorbed query, latent attention) on DeepSeek-V2-Lite's head shape.
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
#include "runtime/gpu/mla_kernels.cuh"
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
          gpu::device::set_packed_mma(mma, /*every_size=*/true);
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

// DeepSeek's MLA kernels on DeepSeek-V2-Lite's head shape (16 heads, kv_lora_rank 512, rope 64, nope 128, v 128)
// against double-precision math on the host: two sequences (200 and 70 positions) whose pages interleave in the pool,
// stored in one step; then query rows at positions 199 and 63 of the first and 69 of the second (several tiles of
// 128 positions, rows sharing a sequence, a sequence past its first page). f32 latent KV: 1e-5 relative; f16: the
// latent's f16 rounding (5e-3); both the one-block-per-(row, head) form and the split one. Then the device time of
// one decode row's query + attention at 4096 positions, in each form.
TEST(MlaKernels, MatchHostMath) {
  SKIP_WITHOUT_GPU();
  namespace d = gpu::device;
  const int64_t heads = 16, nope = 128, rope = 64, lora = 512, v = 128, half = rope / 2, floats = lora + rope;
  const int64_t ldq = heads * (nope + rope);
  const std::vector<int64_t> lengths = {200, 70};
  const std::vector<std::vector<int32_t>> pages = {{5, 0, 7, 2}, {3, 6, 0, 0}};  // page tables, stride 4
  const int64_t stride = 4, pool_pages = 8;
  std::vector<int32_t> table;
  for (const auto& t : pages) table.insert(table.end(), t.begin(), t.end());
  // Every position's [kv_a latent | k_rope] row, in sequence order.
  std::vector<int32_t> positions, seq_of_row;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t t = 0; t < lengths[s]; ++t) positions.push_back(int32_t(t)), seq_of_row.push_back(int32_t(s));
  const int64_t stored = int64_t(positions.size());
  const std::vector<float> kv_a = values(size_t(stored * floats), 1);
  std::vector<float> kv_norm = values(size_t(lora), 2), key = values(size_t(heads * lora * nope), 3);
  std::vector<float> value = values(size_t(heads * v * lora), 4), inv_freq(static_cast<size_t>(half));
  for (float& x : kv_norm) x = 1.0f + x / 4;
  for (float& x : key) x /= 8;  // scores of a few units: a softmax that neither saturates nor flattens
  for (int64_t j = 0; j < half; ++j) inv_freq[size_t(j)] = float(std::pow(10000.0, -double(2 * j) / double(rope)));
  const float rope_scale = 1.25f, eps = 1e-6f, softmax_scale = float(1.0 / std::sqrt(double(nope + rope)));
  // Query rows: (sequence, position).
  const std::vector<std::pair<int32_t, int32_t>> queries = {{0, 199}, {0, 63}, {1, 69}};
  const int64_t rows = int64_t(queries.size());
  const std::vector<float> q = values(size_t(rows * ldq), 5);

  // Host math: the stored rows, then each (row, head)'s output.
  auto turn = [&](const float* x, int32_t pos, double* out) {
    for (int64_t j = 0; j < half; ++j) {
      const double angle = double(float(pos) * inv_freq[size_t(j)]);
      const double c = std::cos(angle) * rope_scale, sn = std::sin(angle) * rope_scale;
      out[j] = x[j] * c - x[j + half] * sn;
      out[j + half] = x[j + half] * c + x[j] * sn;
    }
  };
  std::vector<double> cache(static_cast<size_t>(stored * floats));  // by (sequence, position) in row order
  for (int64_t i = 0; i < stored; ++i) {
    const float* x = kv_a.data() + i * floats;
    double sum = 0;
    for (int64_t j = 0; j < lora; ++j) sum += double(x[j]) * x[j];
    const double inv = 1.0 / std::sqrt(sum / double(lora) + eps);
    for (int64_t j = 0; j < lora; ++j) cache[size_t(i * floats + j)] = kv_norm[size_t(j)] * x[j] * inv;
    turn(x + lora, positions[size_t(i)], &cache[size_t(i * floats + lora)]);
  }
  std::vector<double> want(static_cast<size_t>(rows * heads * v));
  for (int64_t i = 0; i < rows; ++i) {
    const auto [seq, pos] = queries[size_t(i)];
    const double* rows_of_seq = cache.data() + (seq == 0 ? 0 : lengths[0]) * floats;
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q.data() + i * ldq + h * (nope + rope);
      std::vector<double> ql(static_cast<size_t>(lora)), qr(static_cast<size_t>(rope)), mix(size_t(lora), 0.0);
      for (int64_t r = 0; r < lora; ++r)
        for (int64_t j = 0; j < nope; ++j) ql[size_t(r)] += double(key[size_t((h * lora + r) * nope + j)]) * qh[j];
      turn(qh + nope, pos, qr.data());
      std::vector<double> score(static_cast<size_t>(pos + 1));
      double best = -1e300, total = 0;
      for (int64_t t = 0; t <= pos; ++t) {
        double sc = 0;
        for (int64_t r = 0; r < lora; ++r) sc += ql[size_t(r)] * rows_of_seq[t * floats + r];
        for (int64_t j = 0; j < rope; ++j) sc += qr[size_t(j)] * rows_of_seq[t * floats + lora + j];
        score[size_t(t)] = sc * softmax_scale;
        best = std::max(best, score[size_t(t)]);
      }
      for (int64_t t = 0; t <= pos; ++t) {
        const double p = std::exp(score[size_t(t)] - best);
        total += p;
        for (int64_t r = 0; r < lora; ++r) mix[size_t(r)] += p * rows_of_seq[t * floats + r];
      }
      for (int64_t o = 0; o < v; ++o) {
        double acc = 0;
        for (int64_t r = 0; r < lora; ++r) acc += double(value[size_t((h * v + o) * lora + r)]) * mix[size_t(r)];
        want[size_t((i * heads + h) * v + o)] = acc / total;
      }
    }
  }

  Device<float> dkv_a(kv_a), dnorm(kv_norm), dkey(key), dvalue(value), dfreq(inv_freq), dq(q);
  d::MlaParams p;
  p.heads = heads, p.nope = nope, p.rope = rope, p.lora = lora, p.v = v;
  p.norm_eps = eps, p.kv_norm = dnorm.p, p.inv_freq = dfreq.p, p.rope_scale = rope_scale;
  p.softmax_scale = softmax_scale, p.key = dkey.p, p.value = dvalue.p;
  Device<int32_t> dpos(positions), dseq(seq_of_row), dtable(table);
  std::vector<int32_t> qpos, qseq;
  for (const auto& [seq, pos] : queries) qpos.push_back(pos), qseq.push_back(seq);
  Device<int32_t> dqpos(qpos), dqseq(qseq);
  Device<float> q_latent(std::vector<float>(size_t(rows * heads * lora)));
  Device<float> q_rope(std::vector<float>(size_t(rows * heads * rope)));
  Device<float> out(std::vector<float>(size_t(rows * heads * v)));
  const int64_t max_len = 512;  // the split form: chunks of 128 positions, 4 of them (2 used by position 199)
  Device<float> split(std::vector<float>(size_t(d::mla_split_scratch_floats(rows, p, max_len))));
  for (const int codec : {2, 0}) {
    Device<uint8_t> pool(std::vector<uint8_t>(size_t(pool_pages * d::kKvPage * d::latent_row_bytes(codec, floats))));
    const d::LatentKv kv{pool.p, codec};
    d::mla_store_latent(dkv_a.p, floats, stored, p, dpos.p, kv, d::PageTables{dtable.p, stride, dseq.p}, nullptr);
    d::mla_query(dq.p, ldq, rows, p, dqpos.p, q_latent.p, q_rope.p, nullptr);
    const d::PageTables query_tables{dtable.p, stride, dqseq.p};
    d::mla_attention(q_latent.p, q_rope.p, rows, p, dqpos.p, kv, query_tables, out.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const double error = max_relative(out.get(want.size()), want);
    d::mla_attention_split(q_latent.p, q_rope.p, rows, p, dqpos.p, kv, query_tables, max_len, split.p, out.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const double split_error = max_relative(out.get(want.size()), want);
    if (codec == 2) {  // the stored rows as they are in the pool: the first sequence's position 130 (its page 2)
      std::vector<float> all = std::vector<float>(size_t(pool_pages * d::kKvPage * floats));
      cudaMemcpy(all.data(), pool.p, all.size() * sizeof(float), cudaMemcpyDeviceToHost);
      const float* row = all.data() + (int64_t(pages[0][2]) * d::kKvPage + 130 % d::kKvPage) * floats;
      EXPECT_LE(max_relative(std::vector<float>(row, row + floats),
                             std::vector<double>(cache.begin() + 130 * floats, cache.begin() + 131 * floats)), 1e-6);
    }
    EXPECT_LE(error, codec == 2 ? 1e-5 : 5e-3) << "codec " << codec;
    EXPECT_LE(split_error, codec == 2 ? 1e-5 : 5e-3) << "codec " << codec;
    std::printf("[ MLA-KERN ] %s latent KV: max relative error against double math %.3g (split over positions: "
                "%.3g)\n", codec == 2 ? "f32" : "f16", error, split_error);
  }

  // One decode row of V2-Lite's head shape at 4096 positions (f16 latent): device time of query + attention.
  const int64_t long_len = 4096, long_pages = long_len / d::kKvPage;
  std::vector<int32_t> long_table(static_cast<size_t>(long_pages)), long_pos(static_cast<size_t>(long_len));
  for (int64_t i = 0; i < long_pages; ++i) long_table[size_t(i)] = int32_t(long_pages - 1 - i);
  for (int64_t t = 0; t < long_len; ++t) long_pos[size_t(t)] = int32_t(t);
  Device<int32_t> dlong_table(long_table), dlong_pos(long_pos), dzero(std::vector<int32_t>(size_t(long_len), 0));
  Device<float> dlong_kv_a(values(size_t(long_len * floats), 6));
  Device<uint8_t> long_pool(std::vector<uint8_t>(size_t(long_len * d::latent_row_bytes(0, floats))));
  const d::LatentKv long_kv{long_pool.p, 0};
  const d::PageTables long_tables{dlong_table.p, long_pages, dzero.p};
  d::mla_store_latent(dlong_kv_a.p, floats, long_len, p, dlong_pos.p, long_kv, long_tables, nullptr);
  const int32_t last = int32_t(long_len - 1);
  Device<int32_t> dlast(std::vector<int32_t>{last});
  Device<float> long_split(std::vector<float>(size_t(d::mla_split_scratch_floats(1, p, long_len))));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  constexpr int kRepeats = 20;
  double us[2] = {0, 0};
  for (int form = 0; form < 2; ++form) {
    for (int r = 0; r <= kRepeats; ++r) {
      if (r == 1) cudaEventRecord(start);  // the first run warms up
      d::mla_query(dq.p, ldq, 1, p, dlast.p, q_latent.p, q_rope.p, nullptr);
      if (form == 0)
        d::mla_attention(q_latent.p, q_rope.p, 1, p, dlast.p, long_kv, long_tables, out.p, nullptr);
      else
        d::mla_attention_split(q_latent.p, q_rope.p, 1, p, dlast.p, long_kv, long_tables, long_len, long_split.p,
                               out.p, nullptr);
    }
    cudaEventRecord(stop);
    ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    us[form] = 1e3 * ms / kRepeats;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::printf("[ MLA-KERN ] V2-Lite head shape, one decode row at %lld positions (f16 latent, %.2f MB a layer): "
              "query + attention %.1f us a layer, split over positions %.1f us\n", (long long)long_len,
              double(long_len * d::latent_row_bytes(0, floats)) / 1e6, us[0], us[1]);
}

}  // namespace
