// bench/kv_attention_bench.cpp — decode attention time per token for each KV codec at 1K, 8K and 32K positions,
// with the 1B-class llama's attention shape (32 query heads sharing 8 kv heads, head_dim 64) and its 16 layers,
// each step walking every layer once as a real decode does (so small contexts are not served from one warm L2).
// Time is per decode token over all 16 layers (divide by 16 for one layer). Counters: kv_MB (the cache),
// GBps (cache bytes read per second). Threads: the pinned pool, one per physical core.
// Run: build-kv/bench/kv_attention_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "runtime/engine/kv_cache.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/kv/attention.h"
#include "runtime/model/synthetic.h"

namespace {

using namespace tierlm;

kernels::ThreadPool& pool() {
  static kernels::ThreadPool p(0);
  return p;
}

// Random keys/values for positions [0, len) of every layer, encoded in parallel (one layer per task).
void fill(engine::KVCache& cache, const model::ModelConfig& c, int64_t len) {
  pool().parallel_for(c.num_layers, [&](int64_t b, int64_t e, int) {
    for (int64_t layer = b; layer < e; ++layer) {
      std::mt19937 rng(uint32_t(layer + 1));
      std::normal_distribution<float> g(0.0f, 1.0f);
      std::vector<float> k(size_t(c.num_kv_heads * c.head_dim)), v(k.size());
      for (int64_t t = 0; t < len; ++t) {
        for (auto& x : k) x = g(rng);
        for (auto& x : v) x = g(rng);
        cache.store(layer, t, k.data(), v.data());
      }
    }
  });
}

void BM_DecodeAttention(benchmark::State& state) {
  const auto codec = kv::Codec(state.range(0));
  const int64_t len = state.range(1);
  const bool scalar = state.range(2) != 0;
  const model::ModelConfig c = model::llama_1b_config();
  tiering::Ledger ledger;
  engine::KVCache cache(c, len, ledger, {codec, {}, {}});
  fill(cache, c, len);
  const int64_t group = c.num_heads / c.num_kv_heads, hd = c.head_dim;
  std::vector<float> q(size_t(c.num_heads * hd)), out(q.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& x : q) x = g(rng);
  kv::force_scalar_attention(scalar);
  struct Job {
    engine::KVCache* cache;
    int64_t layer, len, group, hd;
    const float* q;
    float* out;
  } job{&cache, 0, len, group, hd, q.data(), out.data()};
  auto run = [](void* ctx, int64_t b, int64_t e, int) {
    auto& j = *static_cast<Job*>(ctx);
    for (int64_t h = b; h < e; ++h)
      j.cache->attend(j.layer, h, j.q + h * j.group * j.hd, j.group, j.len, j.out + h * j.group * j.hd);
  };
  for (auto _ : state) {
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      job.layer = layer;
      pool().parallel_for(c.num_kv_heads, run, &job);
    }
    benchmark::DoNotOptimize(out.data());
  }
  kv::force_scalar_attention(false);
  state.counters["kv_MB"] = double(cache.bytes()) / 1e6;
  const double bytes_read = engine::KVCache::bytes_per_token(c, codec) * double(len) * double(c.num_layers);
  state.counters["GBps"] = benchmark::Counter(bytes_read / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(kv::codec_name(codec)) + (scalar ? " scalar" : ""));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t len : {1024, 8192, 32768})
    for (int codec = 0; codec < kv::kCodecCount; ++codec) b->Args({codec, len, 0});
  b->Args({int(kv::Codec::turbo3), 1024, 1});  // the scalar reference, for scale
}

BENCHMARK(BM_DecodeAttention)->Apply(Args)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
