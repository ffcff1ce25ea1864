// The CUDA decode kernels one at a time against plain double-precision math on the host, on the shapes the models
// use (the tiny default model, the llama-1B bench shape) and odd ones: the f16/bf16 decode matvec (x as is, with the
// RMSNorm fused into its load, with the SiLU gate fused), the few-row matvec (2-4 x rows) and the packed q8_0 one.
// The inputs are exactly representable in the weight format, so the only difference is f32 summation order.
// Without a GPU every test skips with the reason.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "runtime/gpu/device_kernels.cuh"
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

}  // namespace
