// Weight formats and kernels against double-precision references computed from first principles in this file.
#include "runtime/kernels/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "runtime/kernels/kernel_isa.h"
#include "tests/runtime/kernels/isa_test_util.h"

namespace tierlm::kernels {
namespace {

using isa_testing::IsaGuard;
using isa_testing::runnable_isas;

uint32_t fresh_seed() { return std::random_device{}(); }

std::vector<float> random_matrix(std::mt19937& rng, int64_t n) {
  // Mixed magnitudes and a few outliers, like real weights.
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = unit(rng) < 0.01f ? normal(rng) * 20.0f : normal(rng);
  return v;
}

bool is_packed(WeightFormat f) {
  return f == WeightFormat::q8_0 || f == WeightFormat::q4 || f == WeightFormat::mlx_q4 || f == WeightFormat::mlx_q8;
}

// The activation quantization the packed kernels promise (kernel_isa.h): per 32 values, dx = amax/127,
// q = round-to-nearest(x * 127/amax). Returns the dequantized activation and the per-element bound dx/2.
void reference_activation(const float* x, int64_t cols, std::vector<double>& deq, std::vector<double>& half_step) {
  deq.assign(static_cast<size_t>(cols), 0.0);
  half_step.assign(static_cast<size_t>(cols), 0.0);
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float dx = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; ++j) {
      deq[b * 32 + j] = static_cast<double>(dx) * std::nearbyint(x[b * 32 + j] * inv);
      half_step[b * 32 + j] = dx * 0.5;
    }
  }
}

std::vector<double> dequantized(const WeightView& w) {
  std::vector<double> out(static_cast<size_t>(w.rows * w.cols));
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w, r, row.data());
    for (int64_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = row[c];
  }
  return out;
}

// Checks y = W·x for one activation row against the dequantized weight. For packed formats two references:
// with the activation quantized exactly as specified (tight), and with the float activation (bounded by the
// activation rounding: sum |w| * dx/2).
// bf16: products of weights and activations each rounded to 8 significant bits (the AMX prefill path).
void expect_row_matches(const WeightView& w, const std::vector<double>& wd, const float* x, const float* y,
                        const std::string& what, bool bf16 = false) {
  std::vector<double> xd, half;
  if (is_packed(w.format)) reference_activation(x, w.cols, xd, half);
  if (bf16) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double exact = 0, magnitude = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        exact += wd[r * w.cols + c] * x[c];
        magnitude += std::fabs(wd[r * w.cols + c] * x[c]);
      }
      // Each factor within 2^-8 of itself (bf16 keeps 8 significant bits; round to nearest), so each product within
      // 2^-7 + 2^-16; the f32 sums' own rounding on top.
      ASSERT_NEAR(y[r], exact, magnitude * (std::ldexp(1.0, -7) + std::ldexp(1.0, -15)) + 1e-6) << what << " row " << r;
    }
    return;
  }
  for (int64_t r = 0; r < w.rows; ++r) {
    double exact = 0, magnitude = 0, quant_ref = 0, quant_bound = 0;
    for (int64_t c = 0; c < w.cols; ++c) {
      const double wv = wd[r * w.cols + c];
      exact += wv * x[c];
      magnitude += std::fabs(wv * x[c]);
      if (is_packed(w.format)) {
        quant_ref += wv * xd[c];
        quant_bound += std::fabs(wv) * half[c];
      }
    }
    const double rounding = 2e-6 * magnitude * std::sqrt(static_cast<double>(w.cols)) + 1e-6;
    if (is_packed(w.format)) {
      ASSERT_NEAR(y[r], quant_ref, rounding) << what << " row " << r;
      ASSERT_NEAR(y[r], exact, quant_bound + rounding) << what << " row " << r;
    } else {
      ASSERT_NEAR(y[r], exact, rounding) << what << " row " << r;
    }
  }
}

const WeightFormat kMakeFormats[] = {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::q8_0,
                                     WeightFormat::q4};
const SourceType kSources[] = {SourceType::f32, SourceType::f16, SourceType::bf16};

std::vector<uint16_t> to_half(const std::vector<float>& v, SourceType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t == SourceType::f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  return out;
}

TEST(Weights, FormatNames) {
  for (auto f : kMakeFormats) EXPECT_EQ(parse_format(format_name(f)), f);
  EXPECT_EQ(parse_format("q8"), WeightFormat::q8_0);
  // format_from_name: every format by the name profiles record, MLX and MXFP4 included; nothing else.
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16, WeightFormat::q8_0, WeightFormat::q4,
                         WeightFormat::mlx_q4, WeightFormat::mlx_q8, WeightFormat::mxfp4})
    EXPECT_EQ(format_from_name(format_name(f)), f);
  EXPECT_EQ(format_from_name("q8"), std::nullopt);  // parse_format's alias, not a recorded name
  EXPECT_EQ(format_from_name("q3_k"), std::nullopt);
  try {
    parse_format("q3_k");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos);
  }
}

TEST(Weights, HalfConversionsRoundTrip) {
  // Exhaustive over f16: f16 -> f32 -> f16 is the identity (except NaN payloads).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 4096), f32_to_f16(1.0f));  // ties to even
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
}

TEST(Weights, QuantizationErrorWithinHalfStep) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t rows = 67, cols = 160;
  auto src = random_matrix(rng, rows * cols);
  tiering::Ledger ledger;
  for (auto f : {WeightFormat::q8_0, WeightFormat::q4}) {
    Weight w = make_weight(src.data(), SourceType::f32, rows, cols, f, ledger, "weights");
    const auto wd = dequantized(w.view);
    const int64_t groups = cols / 32;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t si = ((r / 16) * groups + c / 32) * 16 + r % 16;
        const double step = f16_to_f32(static_cast<const uint16_t*>(w.view.scales)[si]);
        const double err = std::fabs(wd[r * cols + c] - src[r * cols + c]);
        ASSERT_LE(err, step / 2 * (1 + 1e-6) + 1e-7 * std::fabs(src[r * cols + c]))
            << format_name(f) << " r " << r << " c " << c;
      }
    }
    // And the step is the tight one for the group: q8_0 step <= amax/127 rounded up to f16.
    if (f == WeightFormat::q8_0) {
      float amax = 0;
      for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(src[c]));
      const double step = f16_to_f32(static_cast<const uint16_t*>(w.view.scales)[0]);
      EXPECT_GE(step, amax / 127.0);
      EXPECT_LE(step, amax / 127.0 * (1 + 1.0 / 512));
    }
  }
}

TEST(Weights, MatvecAndMatmulAllFormatsAllIsas) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  IsaGuard guard;
  ThreadPool pool(2);
  tiering::Ledger ledger;
  for (int64_t cols : {96, 160, 4096}) {
    const int64_t rows = 67;
    const auto src = random_matrix(rng, rows * cols);
    const auto x = random_matrix(rng, 37 * cols);
    for (auto f : kMakeFormats) {
      for (auto st : kSources) {
        if (cols == 4096 && st != SourceType::f32) continue;
        const auto half = to_half(src, st);
        const void* p = st == SourceType::f32 ? static_cast<const void*>(src.data()) : half.data();
        Weight w = make_weight(p, st, rows, cols, f, ledger, "weights");
        const auto wd = dequantized(w.view);
        for (Isa isa : runnable_isas()) {
          set_isa_for_testing(isa);
          const std::string what = std::string(format_name(f)) + " cols " + std::to_string(cols) + " isa " +
                                   isa_name(isa) + " src " + std::to_string(static_cast<int>(st));
          std::vector<float> y(static_cast<size_t>(rows), NAN);
          matvec(w.view, x.data(), y.data(), pool);
          expect_row_matches(w.view, wd, x.data(), y.data(), "matvec " + what);
          for (int64_t n : {1, 2, 3, 5, 8, 13, 37}) {
            if (cols == 4096 && isa == Isa::scalar && n != 37) continue;
            std::vector<float> ym(static_cast<size_t>(n * rows), NAN);
            matmul(w.view, x.data(), n, ym.data(), pool);
            // Packed weights take the AMX path from kAmxMinRows rows where the CPU has it, for the whole tiles of 16
            // rows (the rest on the int8 kernels).
            const bool amx = is_packed(f) && n >= kAmxMinRows && amx_enabled();
            for (int64_t i = 0; i < n; ++i)
              expect_row_matches(w.view, wd, x.data() + i * cols, ym.data() + i * rows,
                                 "matmul n " + std::to_string(n) + " i " + std::to_string(i) + " " + what,
                                 amx && i < n / 16 * 16);
          }
        }
      }
    }
  }
}

// Round to the nearest bf16 (ties to even), as the AMX path's conversions do.
double to_bf16(double v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// Where the CPU has AMX, matmul of packed weights from kAmxMinRows rows is, for its whole tiles of 16 rows, the f32
// sum of bf16(weight) x bf16(activation) with each weight dequantized in f32 first: held to that within 1e-5 of the
// magnitude, far below the int8 path's distance from it (the same call with AMX off, checked to be outside the
// bound somewhere).
TEST(Weights, AmxPrefillIsBf16ProductsOfTheDequantizedWeights) {
  if (!amx_supported()) GTEST_SKIP() << "this CPU or OS gives no AMX-BF16 tiles";
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  IsaGuard guard;
  set_isa_for_testing(Isa::avx512);
  ThreadPool pool(2);
  tiering::Ledger ledger;
  for (int64_t cols : {96, 4096}) {
    const int64_t rows = 67;  // a partial last panel
    const auto src = random_matrix(rng, rows * cols);
    const auto x = random_matrix(rng, 100 * cols);
    for (auto f : {WeightFormat::q8_0, WeightFormat::q4}) {
      Weight w = make_weight(src.data(), SourceType::f32, rows, cols, f, ledger, "weights");
      const auto wd = dequantized(w.view);
      for (int64_t n : {kAmxMinRows, int64_t(37), int64_t(100)}) {  // 100: two chunks of tiles, a partial tile
        const std::string what = std::string(format_name(f)) + " cols " + std::to_string(cols) + " n " +
                                 std::to_string(n);
        std::vector<float> y(static_cast<size_t>(n * rows), NAN), y_int8(y.size(), NAN);
        set_amx_for_testing(true);
        matmul(w.view, x.data(), n, y.data(), pool);
        set_amx_for_testing(false);
        matmul(w.view, x.data(), n, y_int8.data(), pool);
        set_amx_for_testing(true);
        bool int8_outside = false;
        for (int64_t i = 0; i < n / 16 * 16; ++i)  // whole tiles: the rest take the int8 kernels
          for (int64_t r = 0; r < rows; ++r) {
            double expect = 0, magnitude = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double wv = wd[r * cols + c], xv = x[i * cols + c];
              expect += to_bf16(wv) * to_bf16(xv);
              magnitude += std::fabs(wv * xv);
            }
            const double bound = 1e-5 * magnitude + 1e-6;
            ASSERT_NEAR(y[i * rows + r], expect, bound) << what << " row " << i << " output " << r;
            int8_outside |= std::fabs(y_int8[i * rows + r] - expect) > bound;
          }
        EXPECT_TRUE(int8_outside) << what << ": the int8 path lands within the bf16 bound everywhere";
      }
    }
  }
}

TEST(Weights, IsasAgreeWithScalar) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  IsaGuard guard;
  ThreadPool pool(1);
  tiering::Ledger ledger;
  const int64_t rows = 67, cols = 4096;
  const auto src = random_matrix(rng, rows * cols);
  const auto x = random_matrix(rng, cols);
  for (auto f : kMakeFormats) {
    Weight w = make_weight(src.data(), SourceType::f32, rows, cols, f, ledger, "weights");
    set_isa_for_testing(Isa::scalar);
    std::vector<float> ref(static_cast<size_t>(rows));
    matvec(w.view, x.data(), ref.data(), pool);
    for (Isa isa : runnable_isas()) {
      set_isa_for_testing(isa);
      std::vector<float> y(static_cast<size_t>(rows));
      matvec(w.view, x.data(), y.data(), pool);
      for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(y[r], ref[r], 1e-4 * (1 + std::fabs(ref[r]))) << isa_name(isa);
    }
  }
}

TEST(Weights, LedgerChargedExactly) {
  std::mt19937 rng(fresh_seed());
  const int64_t rows = 67, cols = 160;
  const auto src = random_matrix(rng, rows * cols);
  for (auto f : kMakeFormats) {
    tiering::Ledger ledger;
    {
      Weight w = make_weight(src.data(), SourceType::f32, rows, cols, f, ledger, "weights");
      EXPECT_EQ(ledger.used("weights"), weight_bytes(w.view)) << format_name(f);
      EXPECT_EQ(ledger.used(), weight_bytes(w.view));
      EXPECT_GE(weight_bytes(w.view), static_cast<uint64_t>(rows * cols / 2));
    }
    EXPECT_EQ(ledger.used("weights"), 0u);
  }
  // A budget too small fails loudly, charging nothing.
  tiering::Ledger tight(1000);
  EXPECT_THROW(make_weight(src.data(), SourceType::f32, rows, cols, WeightFormat::q8_0, tight, "weights"),
               tiering::LedgerError);
  EXPECT_EQ(tight.used(), 0u);
}

TEST(Weights, BadArgumentsThrowClearly) {
  std::vector<float> src(67 * 48, 0.5f);
  tiering::Ledger ledger;
  for (auto f : {WeightFormat::q8_0, WeightFormat::q4}) {
    try {
      make_weight(src.data(), SourceType::f32, 67, 48, f, ledger, "weights");
      FAIL() << "cols 48 accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("multiple"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("48"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(make_weight(src.data(), SourceType::f32, 0, 48, WeightFormat::f32, ledger, "weights"),
               std::invalid_argument);
  EXPECT_THROW(make_weight(src.data(), SourceType::f32, 1, 48, WeightFormat::mlx_q4, ledger, "weights"),
               std::invalid_argument);
  std::vector<float> big(32, 1e6f);
  EXPECT_THROW(make_weight(big.data(), SourceType::f32, 1, 32, WeightFormat::q8_0, ledger, "weights"),
               std::invalid_argument);
  EXPECT_EQ(ledger.used(), 0u);
  EXPECT_THROW(dequantize_row(make_weight(src.data(), SourceType::f32, 2, 2, WeightFormat::f32, ledger, "w").view, 2,
                              src.data()),
               std::out_of_range);
}

TEST(Weights, ZeroAndConstantGroups) {
  tiering::Ledger ledger;
  ThreadPool pool(2);
  std::vector<float> src(20 * 64, 0.0f);
  for (int c = 32; c < 64; ++c) src[c] = -0.75f;  // row 0, group 1 constant
  std::vector<float> x(64, 1.0f);
  for (auto f : kMakeFormats) {
    Weight w = make_weight(src.data(), SourceType::f32, 20, 64, f, ledger, "weights");
    std::vector<float> row(64);
    dequantize_row(w.view, 0, row.data());
    for (int c = 0; c < 64; ++c) EXPECT_NEAR(row[c], src[c], 1e-3) << format_name(f);
    std::vector<float> y(20, NAN);
    matvec(w.view, x.data(), y.data(), pool);
    EXPECT_NEAR(y[0], -24.0f, 0.05f) << format_name(f);
    for (int r = 1; r < 20; ++r) EXPECT_EQ(y[r], 0.0f) << format_name(f);
  }
}

}  // namespace
}  // namespace tierlm::kernels
