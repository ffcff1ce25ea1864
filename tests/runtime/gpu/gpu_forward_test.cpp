// GPU layers vs the CPU forward pass on every fixture model: the same prompt (all logits; > 4 rows, so the cuBLAS
// path) and 16 greedy decode steps (our matvec kernels), all layers + head on the GPU and split (layer 0 on the GPU,
// the rest on the CPU). Oracle: the CPU engine, itself tested against transformers. Greedy tokens must match and
// logits stay within 1e-2 relative (max |diff| / max |cpu|) with the f16 device KV; q8 device KV within 5e-2.
// MoE fixtures run the VRAM expert tier with half of layer 0's experts resident and the fewest slots, so hits,
// resident hits and copies from the host expert cache all happen. Without a GPU every test skips with the reason.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <gtest/gtest.h>

#include "runtime/engine/forward.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/gpu/gpu_probe.h"
#include "runtime/model/model.h"

using namespace tierlm;

namespace {

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(TIERLM_SOURCE_DIR) / "tests/fixtures/models" / name;
}

#define SKIP_WITHOUT_GPU()                                                              \
  do {                                                                                  \
    if (!gpu::gpu_available()) {                                                        \
      std::printf("[  SKIP    ] no GPU: %s\n", gpu::gpu_unavailable_reason().c_str());  \
      GTEST_SKIP() << gpu::gpu_unavailable_reason();                                    \
    }                                                                                   \
  } while (0)

struct Trace {
  std::vector<float> logits;  // prompt rows, then one row per decode step
  std::vector<int32_t> tokens;
};

const std::vector<int32_t> kPrompt = {1, 17, 42, 99, 7, 128, 64, 3, 250, 11};
constexpr int kSteps = 16;

Trace run_trace(const model::ModelWeights& w, tiering::Ledger& ledger, std::shared_ptr<gpu::GpuLayers> g) {
  kernels::ThreadPool pool(2);
  engine::Forward forward(w, pool, ledger, 32, 64);
  if (g) forward.use_gpu(g);
  engine::KVCache cache(w.config, 64, ledger);
  const int64_t V = w.config.vocab_size, n = int64_t(kPrompt.size());
  Trace t;
  t.logits.resize(size_t((n + kSteps) * V));
  forward.run(kPrompt, 0, cache, t.logits.data(), /*all_logits=*/true);
  int32_t next = int32_t(std::max_element(&t.logits[size_t((n - 1) * V)], &t.logits[size_t(n * V)]) -
                         &t.logits[size_t((n - 1) * V)]);
  for (int s = 0; s < kSteps; ++s) {
    t.tokens.push_back(next);
    float* row = &t.logits[size_t((n + s) * V)];
    forward.run(std::span(&next, 1), n + s, cache, row);
    next = int32_t(std::max_element(row, row + V) - row);
  }
  t.tokens.push_back(next);
  return t;
}

double relative_error(const Trace& gpu, const Trace& cpu, int64_t V) {
  double worst = 0;
  for (size_t r = 0; r < cpu.logits.size() / size_t(V); ++r) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < V; ++j) {
      num = std::max(num, double(std::fabs(gpu.logits[r * V + j] - cpu.logits[r * V + j])));
      den = std::max(den, double(std::fabs(cpu.logits[r * V + j])));
    }
    worst = std::max(worst, num / std::max(den, 1e-12));
  }
  return worst;
}

void compare(const std::string& name, std::optional<kernels::WeightFormat> format, gpu::GpuKvCodec codec,
             double tolerance) {
  tiering::Ledger ledger;
  model::LoadOptions options;
  options.ledger = &ledger;
  options.weight_format = format;
  options.expert_format = format;
  options.experts.cache.slots = 4;
  options.experts.cache.prefetch_limit = 0;
  model::ModelWeights w = model::load_model(fixture(name), options);
  const Trace cpu = run_trace(w, ledger, nullptr);
  for (int64_t layers : {w.config.num_layers, int64_t(1)}) {
    gpu::GpuOptions o;
    o.layers = layers;
    o.kv_codec = codec;
    if (w.config.arch.moe) {
      for (int64_t e = 0; e < w.config.num_experts / 2; ++e) o.resident_experts.push_back({0, e});
      o.expert_slots = w.config.num_experts_per_tok;  // the fewest: misses copy from the host cache
    }
    auto g = std::make_shared<gpu::GpuLayers>(w, o, 32, 64);
    const Trace ours = run_trace(w, ledger, g);
    const double err = relative_error(ours, cpu, w.config.vocab_size);
    const gpu::GpuExpertStats st = g->expert_stats();
    std::printf("[ GPU-CPU  ] %-12s %-6s kv=%s gpu_layers=%lld: max relative logit error %.3g, greedy %s; "
                "experts resident %llu slot %llu miss %llu; vram peak %.2f MB\n",
                name.c_str(), format ? kernels::format_name(*format) : "stored",
                codec == gpu::GpuKvCodec::f16 ? "f16" : "q8", (long long)layers, err,
                ours.tokens == cpu.tokens ? "same" : "DIFFERENT", (unsigned long long)st.resident_hits,
                (unsigned long long)st.slot_hits, (unsigned long long)st.misses, double(g->vram_ledger().peak()) / 1e6);
    EXPECT_EQ(ours.tokens, cpu.tokens) << name << " gpu_layers=" << layers;
    EXPECT_LE(err, tolerance) << name << " gpu_layers=" << layers;
    if (w.config.arch.moe && layers == w.config.num_layers) {
      EXPECT_GT(st.resident_hits, 0u);
      EXPECT_GT(st.misses, 0u);
    }
  }
}

class GpuFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFixture, StoredPrecisionMatchesCpu) {
  SKIP_WITHOUT_GPU();
  compare(GetParam(), std::nullopt, gpu::GpuKvCodec::f16, 1e-2);
}

TEST_P(GpuFixture, Q8MatchesCpu) {
  SKIP_WITHOUT_GPU();
  if (GetParam().find("mlx") != std::string::npos) GTEST_SKIP() << "MLX files stay MLX";
  compare(GetParam(), kernels::WeightFormat::q8_0, gpu::GpuKvCodec::f16, 1e-2);
}

TEST_P(GpuFixture, Q4MatchesCpu) {
  SKIP_WITHOUT_GPU();
  if (GetParam().find("mlx") != std::string::npos) GTEST_SKIP() << "MLX files stay MLX";
  compare(GetParam(), kernels::WeightFormat::q4, gpu::GpuKvCodec::f16, 1e-2);
}

TEST_P(GpuFixture, Q8KvMatchesCpu) {
  SKIP_WITHOUT_GPU();
  compare(GetParam(), std::nullopt, gpu::GpuKvCodec::q8, 5e-2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFixture,
                         ::testing::Values("llama3", "smollm", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                                           "olmoe", "qwen2_moe", "llama3-mlx4", "llama3-mlx8"));

TEST(GpuProbe, ReportsMemoryAndRates) {
  SKIP_WITHOUT_GPU();
  const auto p = gpu::probe_gpu(/*quick=*/true);
  ASSERT_TRUE(p.has_value());
  std::printf("[ PROBE    ] %s cc %d, %d SMs, %.1f GiB (%.1f free), h2d %.1f GB/s, d2d %.0f GB/s, f16 gemm %.0f "
              "TFLOP/s\n",
              p->name.c_str(), p->compute_capability, p->multiprocessors, double(p->total_bytes) / (1 << 30),
              double(p->free_bytes) / (1 << 30), p->h2d_pinned_bytes_per_second / 1e9, p->d2d_bytes_per_second / 1e9,
              p->gemm_f16_flops / 1e12);
  EXPECT_GT(p->total_bytes, 0u);
  EXPECT_GT(p->h2d_pinned_bytes_per_second, 1e9);
  EXPECT_GT(p->d2d_bytes_per_second, 1e11);
  EXPECT_GT(p->gemm_f16_flops, 1e12);
}

TEST(GpuLayersWithoutGpu, ConstructorExplains) {
  if (gpu::gpu_available()) GTEST_SKIP() << "a GPU is present";
  tiering::Ledger ledger;
  model::LoadOptions options;
  options.ledger = &ledger;
  model::ModelWeights w = model::load_model(fixture("llama3"), options);
  gpu::GpuOptions o;
  o.layers = 1;
  EXPECT_THROW(gpu::GpuLayers(w, o, 8, 16), std::runtime_error);
}

}  // namespace
