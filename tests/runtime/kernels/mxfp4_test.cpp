// MXFP4 weights kept as gpt-oss stores them (runtime/kernels/mxfp4.h), on every ISA, against exact math: random
// blocks and E8M0 scales are decoded by this test from the format's definition (E2M1 sign bit 3, magnitudes
// 0, .5, 1, 1.5, 2, 3, 4, 6; low nibble first; 2^(scale - 127)), and every matvec / matmul output is compared with the
// double-precision product within the worst-case bound of an f32 dot product of that length (gamma_K * sum |x w|).
// Also: the weight keeps 4.25 bits per weight, dequantize_row equals the decoding, and bad shapes are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "runtime/kernels/kernel_isa.h"
#include "tests/runtime/kernels/isa_test_util.h"
#include "runtime/kernels/weights.h"

namespace tierlm::kernels {
namespace {

using isa_testing::IsaGuard;

// The format's definition, written out independently of the kernels' table.
double decode(uint8_t code, uint8_t scale) {
  const double magnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double v = magnitude[code & 7] * ((code & 8) ? -1.0 : 1.0);
  return std::ldexp(v, int(scale) - 127);
}

struct Packed {
  std::vector<uint8_t> blocks, scales;
  std::vector<double> dense;  // rows x cols, decoded
};

Packed random_packed(int64_t rows, int64_t cols, std::mt19937& rng) {
  Packed p;
  const int64_t groups = cols / 32;
  p.blocks.resize(size_t(rows * groups * 16));
  p.scales.resize(size_t(rows * groups));
  std::uniform_int_distribution<int> byte(0, 255), exponent(120, 130);
  for (auto& b : p.blocks) b = uint8_t(byte(rng));
  for (auto& s : p.scales) s = uint8_t(exponent(rng));
  p.dense.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g)
      for (int j = 0; j < 16; ++j) {
        const uint8_t b = p.blocks[size_t((r * groups + g) * 16 + j)], s = p.scales[size_t(r * groups + g)];
        p.dense[size_t(r * cols + g * 32 + 2 * j)] = decode(b & 0x0F, s);
        p.dense[size_t(r * cols + g * 32 + 2 * j + 1)] = decode(b >> 4, s);
      }
  return p;
}

std::vector<Isa> runnable_isas() {
  std::vector<Isa> out{Isa::scalar};
  if (detected_isa() >= Isa::avx512) out.push_back(Isa::avx512);
  return out;
}

TEST(Mxfp4, MatvecAndMatmulMatchExactMathOnEveryIsa) {
  IsaGuard guard;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double u = std::ldexp(1.0, -24);
  for (auto [rows, cols, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 1}, {17, 64, 1}, {40, 96, 3},
                               {33, 2880, 5}, {64, 128, 16}}) {
    std::mt19937 local(unsigned(rows * 131 + cols + n));
    const Packed p = random_packed(rows, cols, local);
    tiering::Ledger ledger;
    const Weight w = make_mxfp4_weight(p.blocks.data(), p.scales.data(), rows, cols, ledger, "weights");
    EXPECT_EQ(weight_bytes(w.view), uint64_t(rows * cols / 2 + rows * cols / 32));  // 4.25 bits per weight
    std::vector<float> x(size_t(n * cols));
    for (auto& v : x) v = normal(rng);
    const double gamma = double(cols + 2) * u / (1 - double(cols + 2) * u);
    for (Isa isa : runnable_isas()) {
      set_isa_for_testing(isa);
      for (int threads : {1, 3}) {
        ThreadPool pool(threads, false);
        std::vector<float> y(size_t(n * rows), NAN);
        if (n == 1)
          matvec(w.view, x.data(), y.data(), pool);
        else
          matmul(w.view, x.data(), n, y.data(), pool);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            double exact = 0, magnitude = 0;
            for (int64_t c = 0; c < cols; ++c) {
              exact += p.dense[size_t(r * cols + c)] * double(x[size_t(t * cols + c)]);
              magnitude += std::fabs(p.dense[size_t(r * cols + c)] * double(x[size_t(t * cols + c)]));
            }
            ASSERT_LE(std::fabs(double(y[size_t(t * rows + r)]) - exact), gamma * magnitude + 1e-30)
                << isa_name(isa) << " rows " << rows << " cols " << cols << " n " << n << " at " << t << "," << r;
          }
      }
    }
  }
}

TEST(Mxfp4, DequantizeRowIsTheDecoding) {
  std::mt19937 rng(3);
  const Packed p = random_packed(5, 64, rng);
  tiering::Ledger ledger;
  const Weight w = make_mxfp4_weight(p.blocks.data(), p.scales.data(), 5, 64, ledger, "weights");
  std::vector<float> row(64);
  for (int64_t r = 0; r < 5; ++r) {
    dequantize_row(w.view, r, row.data());
    for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(double(row[size_t(c)]), p.dense[size_t(r * 64 + c)]) << r << "," << c;
  }
  // The extreme exponents: 0 is 2^-127 (a denormal), 254 is 2^127.
  const uint8_t blocks[16] = {0x21, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (uint8_t scale : {uint8_t(0), uint8_t(254)}) {
    const Weight e = make_mxfp4_weight(blocks, &scale, 1, 32, ledger, "weights");
    std::vector<float> out(32);
    dequantize_row(e.view, 0, out.data());
    EXPECT_EQ(double(out[0]), decode(1, scale));
    EXPECT_EQ(double(out[1]), decode(2, scale));
  }
}

TEST(Mxfp4, RefusesColumnsThatAreNotWholeBlocks) {
  tiering::Ledger ledger;
  const std::vector<uint8_t> bytes(64, 0);
  EXPECT_THROW(make_mxfp4_weight(bytes.data(), bytes.data(), 1, 48, ledger, "weights"), std::invalid_argument);
  EXPECT_THROW(make_mxfp4_weight(nullptr, bytes.data(), 1, 32, ledger, "weights"), std::invalid_argument);
  EXPECT_THROW(make_weight(bytes.data(), SourceType::f32, 1, 32, WeightFormat::mxfp4, ledger, "weights"),
               std::invalid_argument);
}

}  // namespace
}  // namespace tierlm::kernels
