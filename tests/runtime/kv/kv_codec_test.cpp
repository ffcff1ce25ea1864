// Oracles: exact math. Layout sizes from the codec definitions; f32 attention against a double-precision softmax
// attention; every codec's attention on compressed pages against plain attention over what the codec stands for
// (its reference decoders); the AVX-512 kernels against the scalar reference; distortion against TurboQuant's
// bounds (arXiv 2504.19874, Theorems 1-2). Quality numbers are printed for the report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/engine/kv_cache.h"
#include "runtime/kv/attention.h"
#include "runtime/kv/block_codec.h"
#include "runtime/kv/page_pool.h"
#include "runtime/kv/turbo_quant.h"

using namespace tierlm;
using kv::Codec;

namespace {

const Codec kAll[] = {Codec::f32, Codec::f16, Codec::q8, Codec::turbo3, Codec::turbo4};

model::ModelConfig config_for(int head_dim, int kv_heads, int heads, int layers = 1) {
  model::ModelConfig c;
  c.num_layers = layers;
  c.head_dim = head_dim;
  c.num_kv_heads = kv_heads;
  c.num_heads = heads;
  c.hidden_size = heads * head_dim;
  return c;
}

std::vector<float> gaussian(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> g(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Keys as real models make them: a few channels carry most of the energy.
void add_outlier_channels(std::vector<float>& keys, int d, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, d - 1);
  const int channels[] = {pick(rng), pick(rng), pick(rng), pick(rng)};
  for (size_t t = 0; t < keys.size() / size_t(d); ++t)
    for (int c : channels) keys[t * size_t(d) + size_t(c)] = keys[t * size_t(d) + size_t(c)] * 15.0f + 10.0f;
}

// Softmax attention in double over explicit vectors: the oracle.
void reference_attention(const float* q, const std::vector<float>& keys, const std::vector<float>& values, int d,
                         int64_t len, float* out) {
  std::vector<double> s(static_cast<size_t>(len));
  double mx = -1e300;
  for (int64_t t = 0; t < len; ++t) {
    double dot = 0;
    for (int j = 0; j < d; ++j) dot += double(q[j]) * keys[size_t(t) * d + j];
    s[size_t(t)] = dot / std::sqrt(double(d));
    mx = std::max(mx, s[size_t(t)]);
  }
  double sum = 0;
  for (auto& x : s) sum += (x = std::exp(x - mx));
  for (int j = 0; j < d; ++j) {
    double o = 0;
    for (int64_t t = 0; t < len; ++t) o += s[size_t(t)] * values[size_t(t) * d + j];
    out[j] = float(o / sum);
  }
}

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(KVCodec, BitsPerDimensionAndCompression) {
  for (int d : {64, 128}) {
    const auto t3 = kv::layout_for(Codec::turbo3, d), t4 = kv::layout_for(Codec::turbo4, d);
    const auto f16 = kv::layout_for(Codec::f16, d), q8 = kv::layout_for(Codec::q8, d);
    EXPECT_DOUBLE_EQ(t3.key_bits_per_dim(), 4 + 16.0 / d);  // 4-bit codes + an f16 norm (no QJL plane)
    EXPECT_DOUBLE_EQ(t3.value_bits_per_dim(), 3 + 16.0 / d);
    EXPECT_DOUBLE_EQ(t4.key_bits_per_dim(), 4 + 16.0 / d);
    EXPECT_DOUBLE_EQ(f16.key_bits_per_dim(), 16);
    EXPECT_DOUBLE_EQ(q8.key_bits_per_dim(), 8.5);
    // Per token per layer with 8 kv heads (1B-class shapes), pages included.
    const auto c = config_for(d, 8, 32);
    const double ratio = engine::KVCache::bytes_per_token(c, Codec::f16) / engine::KVCache::bytes_per_token(c, Codec::turbo3);
    std::printf("head_dim %d: bytes/token/layer f16 %.0f, q8 %.0f, turbo4 %.0f, turbo3 %.0f; f16/turbo3 %.2fx; "
                "turbo3 K %.3f V %.3f bits/dim\n", d, engine::KVCache::bytes_per_token(c, Codec::f16),
                engine::KVCache::bytes_per_token(c, Codec::q8), engine::KVCache::bytes_per_token(c, Codec::turbo4),
                engine::KVCache::bytes_per_token(c, Codec::turbo3), ratio, t3.key_bits_per_dim(),
                t3.value_bits_per_dim());
    EXPECT_GE(ratio, 3.5);
  }
  EXPECT_THROW(kv::layout_for(Codec::turbo3, 48), std::invalid_argument);  // not a power of two
  EXPECT_THROW(kv::parse_codec("turbo2"), std::invalid_argument);
  EXPECT_EQ(kv::parse_codec("turbo3"), Codec::turbo3);
}

// Telemetry: KV bytes by codec follow cache lifetimes, and the ledger's "kv" account holds exactly the pages.
TEST(KVCodec, BytesByCodecTelemetry) {
  const auto before = kv::kv_bytes_by_codec();
  tiering::Ledger ledger;
  const auto c = config_for(64, 8, 32, 2);
  {
    engine::KVCache a(c, 100, ledger, {Codec::turbo3, {}, {}});
    engine::KVCache b(c, 100, ledger, {Codec::f16, {}, {}});
    const auto now = kv::kv_bytes_by_codec();
    const auto t3 = size_t(Codec::turbo3), f16 = size_t(Codec::f16);
    EXPECT_EQ(now[t3].reserved_bytes - before[t3].reserved_bytes, a.bytes());
    EXPECT_EQ(now[f16].reserved_bytes - before[f16].reserved_bytes, b.bytes());
    EXPECT_EQ(now[t3].used_bytes - before[t3].used_bytes, a.bytes());
    EXPECT_EQ(ledger.used(tiering::accounts::kv), a.bytes() + b.bytes());
    EXPECT_EQ(a.bytes(), engine::KVCache::bytes_for(c, 100, {Codec::turbo3, {}, {}}));
    EXPECT_GE(double(b.bytes()) / double(a.bytes()), 3.5);
  }
  const auto after = kv::kv_bytes_by_codec();
  for (int i = 0; i < kv::kCodecCount; ++i) {
    EXPECT_EQ(after[size_t(i)].reserved_bytes, before[size_t(i)].reserved_bytes);
    EXPECT_EQ(after[size_t(i)].used_bytes, before[size_t(i)].used_bytes);
  }
  EXPECT_EQ(ledger.used(tiering::accounts::kv), 0u);
}

TEST(KVCodec, LloydMaxCentroidsOfTheNormal) {
  const auto& T = kv::TurboTables::get(64);
  // Known Lloyd-Max levels for N(0,1): 1 bit +-sqrt(2/pi), 2 bits +-0.4528, +-1.5104.
  EXPECT_NEAR(T.centroids(1)[1], std::sqrt(2.0 / M_PI), 1e-5);
  EXPECT_NEAR(T.centroids(2)[2], 0.4528, 1e-3);
  EXPECT_NEAR(T.centroids(2)[3], 1.5104, 1e-3);
  EXPECT_NEAR(T.centroids(3)[7], 2.152, 1e-3);
  // The rotation is orthogonal.
  std::mt19937 rng(3);
  auto x = gaussian(64, rng), y = x, back = x;
  T.rotate(x.data(), y.data());
  T.unrotate(y.data(), back.data());
  EXPECT_LT(rel_l2(back.data(), x.data(), 64), 1e-6);
}

TEST(KVCodec, RoundTripOfExactAndScalarCodecs) {
  const int d = 64;
  std::mt19937 rng(1);
  for (Codec codec : {Codec::f32, Codec::f16, Codec::q8}) {
    const auto L = kv::layout_for(codec, d);
    std::vector<uint8_t> region(L.head_bytes());
    for (int slot = 0; slot < kv::kBlockTokens; ++slot) {
      auto k = gaussian(d, rng), v = gaussian(d, rng), k2 = k, v2 = v;
      kv::encode_key(L, region.data(), slot, k.data());
      kv::encode_value(L, region.data() + L.key_bytes, slot, v.data());
      kv::decode_key(L, region.data(), slot, k2.data());
      kv::decode_value(L, region.data() + L.key_bytes, slot, v2.data());
      const double tol = codec == Codec::f32 ? 0 : codec == Codec::f16 ? 1e-3 : 1.5e-2;
      EXPECT_LE(rel_l2(k2.data(), k.data(), d), tol) << kv::codec_name(codec);
      EXPECT_LE(rel_l2(v2.data(), v.data(), d), tol) << kv::codec_name(codec);
    }
  }
}

// Attention on the pages equals softmax attention over the codec's own decoded vectors, for every codec (and the
// QJL key variant, which no named codec uses since turbo3 took 4-bit MSE keys), length (partial pages, several
// pages), GQA group size (split at 4) and both kernel sets.
TEST(KVCodec, AttentionOnPagesMatchesAttentionOnDecodedVectors) {
  const int d = 32, kv_heads = 2;
  std::vector<engine::KVCacheOptions> options;
  for (Codec codec : kAll) options.push_back({codec, {}, {}});
  options.push_back({Codec::turbo3, {}, kv::TurboSpec{3, true, 3}});
  for (const engine::KVCacheOptions& option : options)
    for (int group : {1, 3, 6})
      for (int64_t len : {1, 17, 70}) {
        const Codec codec = option.codec;
        tiering::Ledger ledger;
        const auto c = config_for(d, kv_heads, kv_heads * group);
        engine::KVCache cache(c, 96, ledger, option);
        std::mt19937 rng(uint32_t(len * 7 + group));
        for (int64_t t = 0; t < len; ++t) {
          auto k = gaussian(static_cast<size_t>(kv_heads * d), rng), v = gaussian(static_cast<size_t>(kv_heads * d), rng);
          cache.store(0, t, k.data(), v.data());
        }
        auto q = gaussian(static_cast<size_t>(group * d), rng, 0.5f);
        for (int64_t h = 0; h < kv_heads; ++h) {
          std::vector<float> keys(static_cast<size_t>(len * d)), values(static_cast<size_t>(len * d));
          for (int64_t t = 0; t < len; ++t) {
            cache.load_key(0, t, h, &keys[size_t(t * d)]);
            cache.load_value(0, t, h, &values[size_t(t * d)]);
          }
          std::vector<float> want(static_cast<size_t>(group * d)), fast(want.size()), scalar(want.size());
          for (int g = 0; g < group; ++g) reference_attention(&q[size_t(g * d)], keys, values, d, len, &want[size_t(g * d)]);
          cache.attend(0, h, q.data(), group, len, fast.data());
          kv::force_scalar_attention(true);
          cache.attend(0, h, q.data(), group, len, scalar.data());
          kv::force_scalar_attention(false);
          EXPECT_LT(rel_l2(scalar.data(), want.data(), want.size()), 2e-5) << kv::codec_name(codec) << " len " << len;
          EXPECT_LT(rel_l2(fast.data(), want.data(), want.size()), 2e-5) << kv::codec_name(codec) << " len " << len;
        }
      }
}

// TurboQuant distortion on unit vectors against the paper's upper bounds:
//   MSE quantizer (b bits):             E||x - x^||^2        <= sqrt(3) pi / 2 * 4^-b
//   inner product ((b-1) bits + QJL):   E(<y,x> - <y,x^>)^2  <= sqrt(3) pi^2 ||y||^2 / d * 4^-b, and unbiased.
TEST(KVCodecQuality, DistortionWithinTurboQuantBounds) {
  const int d = 128, trials = 4000;
  std::mt19937 rng(11);
  std::printf("TurboQuant distortion, d = %d, %d unit vectors (bound in parentheses)\n", d, trials);
  for (int b = 1; b <= 4; ++b) {
    // MSE codec: b-bit values (decode_value is the MSE dequantizer).
    const auto mse_layout = kv::turbo_layout({b, false, b}, d);
    std::vector<uint8_t> region(mse_layout.head_bytes());
    double mse = 0;
    for (int i = 0; i < trials; ++i) {
      auto x = gaussian(d, rng);
      double n = 0;
      for (float v : x) n += double(v) * v;
      for (float& v : x) v = float(v / std::sqrt(n));
      std::vector<float> y(static_cast<size_t>(d));
      kv::encode_value(mse_layout, region.data() + mse_layout.key_bytes, 0, x.data());
      kv::decode_value(mse_layout, region.data() + mse_layout.key_bytes, 0, y.data());
      for (int j = 0; j < d; ++j) mse += double(x[size_t(j)] - y[size_t(j)]) * (x[size_t(j)] - y[size_t(j)]);
    }
    mse /= trials;
    const double mse_bound = std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -b);
    // Inner-product codec at b bits in all: (b-1)-bit MSE + 1-bit QJL (b = 1: QJL alone is not built; skip).
    double prod_err = 0, prod_bias = 0, mse_only_err = 0, mse_only_bias = 0;
    if (b >= 2) {
      const auto prod_layout = kv::turbo_layout({b - 1, true, 1}, d);
      const auto same_bits_mse = kv::turbo_layout({b, false, 1}, d);
      std::vector<uint8_t> r1(prod_layout.head_bytes()), r2(same_bits_mse.head_bytes());
      for (int i = 0; i < trials; ++i) {
        auto x = gaussian(d, rng), y = gaussian(d, rng);
        double n = 0, ny = 0;
        for (float v : x) n += double(v) * v;
        for (float v : y) ny += double(v) * v;
        for (float& v : x) v = float(v / std::sqrt(n));
        for (float& v : y) v = float(v / std::sqrt(ny));
        // Correlated pairs, as attention cares most about the keys a query matches.
        for (int j = 0; j < d; ++j) y[size_t(j)] = 0.5f * y[size_t(j)] + 0.5f * x[size_t(j)];
        std::vector<float> xp(static_cast<size_t>(d)), xm(static_cast<size_t>(d));
        kv::encode_key(prod_layout, r1.data(), 0, x.data());
        kv::decode_key(prod_layout, r1.data(), 0, xp.data());
        kv::encode_key(same_bits_mse, r2.data(), 0, x.data());
        kv::decode_key(same_bits_mse, r2.data(), 0, xm.data());
        double exact = 0, est = 0, est_m = 0, yy = 0;
        for (int j = 0; j < d; ++j) {
          exact += double(y[size_t(j)]) * x[size_t(j)];
          est += double(y[size_t(j)]) * xp[size_t(j)];
          est_m += double(y[size_t(j)]) * xm[size_t(j)];
          yy += double(y[size_t(j)]) * y[size_t(j)];
        }
        prod_err += (est - exact) * (est - exact) / yy;
        prod_bias += (est - exact) / exact;
        mse_only_err += (est_m - exact) * (est_m - exact) / yy;
        mse_only_bias += (est_m - exact) / exact;
      }
      prod_err /= trials;
      prod_bias /= trials;
      mse_only_err /= trials;
      mse_only_bias /= trials;
      const double prod_bound = std::sqrt(3.0) * M_PI * M_PI / d * std::pow(4.0, -b);
      std::printf("  b=%d  MSE %.4f (%.4f)   inner-product err/||y||^2: %d-bit+QJL %.2e (%.2e) bias %+.3f | %d-bit MSE "
                  "%.2e bias %+.3f\n", b, mse, mse_bound, b - 1, prod_err, prod_bound, prod_bias, b, mse_only_err,
                  mse_only_bias);
      EXPECT_LE(prod_err, prod_bound);
      EXPECT_LT(std::fabs(prod_bias), 0.02) << "QJL makes the inner product unbiased";
    } else {
      std::printf("  b=%d  MSE %.4f (%.4f)\n", b, mse, mse_bound);
    }
    EXPECT_LE(mse, mse_bound);
  }
}

// Attention-output error against fp32 for every codec on random keys and on keys with outlier channels, and the
// inner-product (score) error; plus the QJL ablation at equal key bits: 3-bit + QJL against 4-bit MSE keys (and
// 2-bit + QJL against 3-bit MSE), values at 3 bits in all four.
TEST(KVCodecQuality, AttentionErrorAgainstFp32) {
  const int d = 128, len = 1024, queries = 32;
  struct Variant {
    std::string name;
    engine::KVCacheOptions options;
    double random_limit, outlier_limit;  // sanity bounds well above the measured values printed below
  };
  const std::vector<Variant> variants = {
      {"f32", {Codec::f32, {}, {}}, 1e-5, 1e-5},
      {"f16", {Codec::f16, {}, {}}, 1e-3, 5e-3},
      {"q8", {Codec::q8, {}, {}}, 1e-2, 3e-2},
      {"turbo4", {Codec::turbo4, {}, {}}, 0.15, 0.25},
      {"turbo3", {Codec::turbo3, {}, {}}, 0.25, 0.5},
      {"K3+QJL+V3 (old turbo3)", {Codec::turbo3, {}, kv::TurboSpec{3, true, 3}}, 0.25, 0.5},
      {"K2+QJL+V3", {Codec::turbo3, {}, kv::TurboSpec{2, true, 3}}, 0.4, 0.8},
      {"K3+V3 (no QJL)", {Codec::turbo3, {}, kv::TurboSpec{3, false, 3}}, 0.4, 0.8},
  };
  std::printf("attention vs fp32, d = %d, %d positions, %d queries: mean rel. L2 error of scores | of outputs\n", d,
              len, queries);
  for (bool outliers : {false, true}) {
    std::mt19937 rng(outliers ? 5 : 4);
    auto keys = gaussian(size_t(len) * d, rng), values = gaussian(size_t(len) * d, rng);
    if (outliers) add_outlier_channels(keys, d, rng);
    std::vector<float> qs;
    for (int i = 0; i < queries; ++i) {  // queries that attend somewhere: a noisy copy of a random key
      const int t = int(rng() % len);
      auto noise = gaussian(size_t(d), rng, 1.0f);
      for (int j = 0; j < d; ++j) qs.push_back(0.15f * keys[size_t(t) * d + j] + noise[size_t(j)] * 0.3f);
    }
    for (const Variant& variant : variants) {
      tiering::Ledger ledger;
      engine::KVCache cache(config_for(d, 1, 1), len, ledger, variant.options);
      for (int t = 0; t < len; ++t) cache.store(0, t, &keys[size_t(t) * d], &values[size_t(t) * d]);
      std::vector<float> decoded(keys.size());
      for (int t = 0; t < len; ++t) cache.load_key(0, t, 0, &decoded[size_t(t) * d]);
      double score_err = 0, out_err = 0;
      for (int i = 0; i < queries; ++i) {
        const float* q = &qs[size_t(i) * d];
        std::vector<float> want(static_cast<size_t>(d)), got(static_cast<size_t>(d));
        reference_attention(q, keys, values, d, len, want.data());
        cache.attend(0, 0, q, 1, len, got.data());
        out_err += rel_l2(got.data(), want.data(), size_t(d)) / queries;
        double num = 0, den = 0;
        for (int t = 0; t < len; ++t) {
          double e = 0, x = 0;
          for (int j = 0; j < d; ++j) {
            e += double(q[j]) * decoded[size_t(t) * d + j];
            x += double(q[j]) * keys[size_t(t) * d + j];
          }
          num += (e - x) * (e - x);
          den += x * x;
        }
        score_err += std::sqrt(num / den) / queries;
      }
      const auto& l = cache.layout(0);
      std::printf("  %-8s %-22s K %.3f V %.3f bits/dim  scores %.2e | outputs %.2e\n",
                  outliers ? "outliers" : "random", variant.name.c_str(), l.key_bits_per_dim(),
                  l.value_bits_per_dim(), score_err, out_err);
      EXPECT_LT(out_err, outliers ? variant.outlier_limit : variant.random_limit) << variant.name;
    }
  }
}

}  // namespace

// Softmax weights are exp(score - max): for scores spread past 87 (random synthetic models) those are under FLT_MIN,
// and a denormal weight makes every FMA of the value accumulation take a microcode assist on Intel cores (a 16-thread
// Xeon's 128-row prefill chunk: 130 -> 70 ms when they became zeros). Every kernel set gives 0 or a normal number,
// and the sum is exp's to float precision.
TEST(KVCodec, SoftmaxWeightsAreNeverDenormal) {
  std::vector<const kv::AttentionKernels*> sets{&kv::scalar_attention_kernels()};
  if (kv::avx512_attention_available()) sets.push_back(&kv::avx512_attention_kernels());
  for (const kv::AttentionKernels* k : sets) {
    std::vector<float> x;
    for (float v = 0.0f; v > -120.0f; v -= 0.37f) x.push_back(v);  // 0, -0.37, ..., past exp's denormal range
    const std::vector<float> scores = x;
    const float sum = k->exp_sum(x.data(), int(x.size()), 0.0f);
    double expected = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(x[i] == 0.0f || std::fpclassify(x[i]) == FP_NORMAL) << "exp(" << scores[i] << ") = " << x[i];
      if (scores[i] >= kv::kSoftmaxExpFloor) {
        // (the AVX-512 exp's relative error grows with |x|: x log2 e is rounded to float, ~|x| ulps)
        EXPECT_NEAR(x[i], std::exp(double(scores[i])), 2e-5 * std::exp(double(scores[i]))) << scores[i];
      } else {
        EXPECT_EQ(x[i], 0.0f) << scores[i];
      }
      expected += std::exp(double(scores[i]));
    }
    EXPECT_NEAR(sum, expected, 1e-6 * expected);
  }
  EXPECT_EQ(kv::softmax_exp(-87.5f), 0.0f);
  EXPECT_EQ(std::fpclassify(kv::softmax_exp(kv::kSoftmaxExpFloor)), FP_NORMAL);
}
