// MLX affine weights: the repacked layout must reproduce MLX's w = scales * q + biases exactly, where q is element j
// of a little-end-first uint32 word (bits [j*bits, (j+1)*bits)), for every group size, bit width and scale type; and
// matvec/matmul must compute those weights times f32 activations, as MLX does (to f32 accumulation error), with a
// row's result independent of how many rows are multiplied at once.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "runtime/kernels/affine_f32.h"
#include "runtime/kernels/kernel_isa.h"
#include "runtime/kernels/weights.h"

namespace tierlm::kernels {
namespace {

struct MlxTensor {
  int64_t rows, cols;
  int group, bits;
  SourceType scale_type;
  std::vector<uint32_t> codes;  // one code per element, for the direct formula
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;  // raw bytes in scale_type
  float scale(int64_t i) const { return load_scale(scales.data(), scale_type, i); }
  float bias(int64_t i) const { return load_scale(biases.data(), scale_type, i); }
};

void put(std::vector<uint8_t>& v, SourceType t, int64_t i, float f) {
  if (t == SourceType::f32) {
    std::memcpy(v.data() + i * 4, &f, 4);
  } else {
    const uint16_t h = t == SourceType::f16 ? f32_to_f16(f) : f32_to_bf16(f);
    std::memcpy(v.data() + i * 2, &h, 2);
  }
}

MlxTensor make_tensor(std::mt19937& rng, int64_t rows, int64_t cols, int group, int bits, SourceType st) {
  MlxTensor t{rows, cols, group, bits, st, {}, {}, {}, {}};
  std::uniform_int_distribution<uint32_t> code(0, (1u << bits) - 1);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f), bias(-0.1f, 0.1f);
  t.codes.resize(static_cast<size_t>(rows * cols));
  for (auto& c : t.codes) c = code(rng);
  const int per_word = 32 / bits;
  t.packed.assign(static_cast<size_t>(rows * cols / per_word), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t.packed[(r * cols + c) / per_word] |= t.codes[r * cols + c] << ((c % per_word) * bits);
  const size_t es = st == SourceType::f32 ? 4 : 2;
  const int64_t ngroups = rows * (cols / group);
  t.scales.resize(ngroups * es);
  t.biases.resize(ngroups * es);
  for (int64_t i = 0; i < ngroups; ++i) {
    put(t.scales, st, i, scale(rng));
    put(t.biases, st, i, bias(rng));
  }
  return t;
}

float direct(const MlxTensor& t, int64_t r, int64_t c) {
  const int64_t g = r * (t.cols / t.group) + c / t.group;
  return t.scale(g) * static_cast<float>(t.codes[r * t.cols + c]) + t.bias(g);
}

TEST(MlxWeights, DequantizeMatchesFormulaAndKernelsMatchReference) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ThreadPool pool(2);
  for (int bits : {4, 8}) {
    for (int group : {32, 64, 128}) {
      for (SourceType st : {SourceType::f16, SourceType::bf16, SourceType::f32}) {
        const int64_t rows = 67, cols = 384;
        const MlxTensor t = make_tensor(rng, rows, cols, group, bits, st);
        tiering::Ledger ledger;
        Weight w = make_mlx_weight(t.packed.data(), t.scales.data(), t.biases.data(), st, rows, cols, group, bits,
                                   ledger, "weights");
        EXPECT_EQ(w.view.format, bits == 4 ? WeightFormat::mlx_q4 : WeightFormat::mlx_q8);
        EXPECT_EQ(ledger.used("weights"), weight_bytes(w.view));
        const std::string what = "bits " + std::to_string(bits) + " group " + std::to_string(group);
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
          dequantize_row(w.view, r, row.data());
          for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(row[c], direct(t, r, c)) << what << " r " << r << " c " << c;
        }
        // Kernels, for every ISA, matvec and matmul (n = 11 walks every activation tile size): by default against
        // sum_c direct(r, c) * x[c] in double (MLX multiplies float activations; the only error left is f32
        // accumulation, bounded relative to sum |d*u*x| + |m*x|); with the int8-activation path forced, against
        // the same sum with x quantized as kernel_isa.h specifies.
        std::uniform_real_distribution<float> xs(-1.0f, 1.0f);
        const int64_t n = 11;
        std::vector<float> x(static_cast<size_t>(n * cols));
        for (auto& v : x) v = xs(rng);
        for (MlxActivations mode : {MlxActivations::f32, MlxActivations::int8}) {
          set_mlx_activations_for_testing(mode);
          const bool exact = mode == MlxActivations::f32;
          for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
            if (isa > detected_isa()) continue;
            set_isa_for_testing(isa);
            std::vector<float> y(static_cast<size_t>(n * rows));
            matmul(w.view, x.data(), n, y.data(), pool);
            std::vector<float> yv(static_cast<size_t>(rows));
            matvec(w.view, x.data(), yv.data(), pool);
            for (int64_t i = 0; i < n; ++i) {
              for (int64_t r = 0; r < rows; ++r) {
                double ref = 0, mag = 0;
                for (int64_t b = 0; b < cols / 32; ++b) {
                  float amax = 0;
                  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i * cols + b * 32 + j]));
                  for (int j = 0; j < 32; ++j) {
                    const int64_t c = b * 32 + j, g = r * (cols / group) + c / group;
                    const double xv = exact ? double(x[i * cols + c])
                                            : (amax / 127.0f) * std::nearbyint(x[i * cols + c] * (127.0f / amax));
                    ref += direct(t, r, c) * xv;
                    mag += std::fabs(t.scale(g) * t.codes[r * cols + c] * xv) + std::fabs(t.bias(g) * xv);
                  }
                }
                const double tolerance = 1e-5 * mag + 1e-6;
                const std::string where = what + " isa " + isa_name(isa) + (exact ? " f32" : " int8");
                ASSERT_NEAR(y[i * rows + r], ref, tolerance) << where << " row " << r << " act " << i;
                if (i == 0) {
                  ASSERT_NEAR(yv[r], ref, tolerance) << where << " row " << r;
                  // f32 activations: a row's sums run in one order whatever the batch, so decode, chunked prefill
                  // and batches agree bit for bit.
                  if (exact) {
                    ASSERT_EQ(yv[r], y[r]) << where << " row " << r << ": matvec differs from matmul";
                  }
                }
              }
            }
          }
        }
        set_mlx_activations_for_testing(MlxActivations::f32);
        set_isa_for_testing(detected_isa());
      }
    }
  }
}

TEST(MlxWeights, BadArguments) {
  std::vector<uint32_t> packed(64 * 8, 0);
  std::vector<uint16_t> s(64 * 8, 0);
  tiering::Ledger ledger;
  auto make = [&](int64_t cols, int group, int bits) {
    return make_mlx_weight(packed.data(), s.data(), s.data(), SourceType::f16, 2, cols, group, bits, ledger, "w");
  };
  EXPECT_THROW(make(64, 64, 3), std::invalid_argument);
  EXPECT_THROW(make(96, 48, 4), std::invalid_argument);
  try {
    make(96, 64, 4);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of group_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_mlx_weight(nullptr, s.data(), s.data(), SourceType::f16, 2, 64, 64, 4, ledger, "w"),
               std::invalid_argument);
  EXPECT_EQ(ledger.used(), 0u);
}

}  // namespace
}  // namespace tierlm::kernels
