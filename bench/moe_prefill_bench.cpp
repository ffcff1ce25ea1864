// bench/moe_prefill_bench.cpp — one MoE layer of a prefill chunk (engine::MoeBlock::accumulate, every expert
// resident) on fit_accuracy_bench's synthetic MoE (8 layers x 32 experts, top-4, 1024 x 1024 q4 experts: a 128-row
// chunk gives each expert ~16 rows), with the experts on lanes or each split over the pool, routed (`routing`) by
// the model's router (0), evenly (1: exactly 16 rows an expert, no imbalance, no short tails) or uniformly at random
// (2: each row k distinct experts, so an expert's rows vary as uniform routing makes them). Reports the experts'
// GFLOP/s (gate_up and down) to set against calibrate's expert probe (fit_accuracy_bench prints it) and against the
// same experts' GEMMs alone (BM_LaneGemmsAlone).
// The model is written to $MOE_PREFILL_DIR (default /tmp/moe-prefill-bench) the first time (~480 MiB).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "runtime/engine/moe.h"
#include "runtime/kernels/matmul_scratch.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "bench/fit_moe_spec.h"
#include "runtime/model/synthetic_moe.h"
#include "tiering/ledger.h"

using namespace tierlm;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRows = 128;

struct Loaded {
  tiering::Ledger ledger;
  model::ModelWeights w;
};

Loaded& loaded() {
  static std::unique_ptr<Loaded> l = [] {
    const char* env = std::getenv("MOE_PREFILL_DIR");
    const fs::path dir = env ? env : "/tmp/moe-prefill-bench";
    const model::SyntheticMoeSpec spec = bench::fit_moe_spec();
    if (!fs::exists(dir / "config.json")) model::write_synthetic_moe(dir, spec);
    auto p = std::make_unique<Loaded>();
    model::LoadOptions o;
    o.ledger = &p->ledger;
    o.packed_experts = (dir / "experts.tierlm").string();
    for (int64_t l = 0; l < spec.layers; ++l)
      for (int32_t e = 0; e < spec.experts; ++e) o.experts.cache.resident.emplace_back(l, e);
    o.experts.cache.slots = spec.top_k;
    p->w = model::load_model(dir, o);
    return p;
  }();
  return *l;
}

void BM_MoePrefillLayer(benchmark::State& state) {
  const bool lanes = state.range(0) != 0, even = state.range(1) == 1;
  const int threads = int(state.range(2));
  Loaded& l = loaded();
  const auto& c = l.w.config;
  kernels::ThreadPool pool(threads);
  engine::MoeBlock block(l.w, pool, l.ledger, kRows);
  block.set_lanes(lanes);
  if (even)  // row i takes experts (i * k + j) mod E: every expert exactly rows * k / E rows
    block.set_routing_override([&](int64_t, int64_t row, std::span<int32_t> ids, std::span<float> weights) {
      for (size_t j = 0; j < ids.size(); ++j) {
        ids[j] = int32_t((row * int64_t(ids.size()) + int64_t(j)) % c.num_experts);
        weights[j] = 1.0f / float(ids.size());
      }
    });
  if (state.range(1) == 2)  // uniform routing: each row k distinct experts at random (fixed seed per layer and row)
    block.set_routing_override([&](int64_t layer, int64_t row, std::span<int32_t> ids, std::span<float> weights) {
      uint64_t s = uint64_t(layer * 1000003 + row) * 0x9e3779b97f4a7c15ull + 1;
      for (size_t j = 0; j < ids.size(); ++j) {
        for (bool fresh = false; !fresh;) {
          s ^= s << 13, s ^= s >> 7, s ^= s << 17;
          ids[j] = int32_t(s % uint64_t(c.num_experts));
          fresh = std::find(ids.begin(), ids.begin() + j, ids[j]) == ids.begin() + j;
        }
        weights[j] = 1.0f / float(ids.size());
      }
    });
  // The routing's spread: the most rows one expert got in a step, averaged over the steps.
  double most_rows = 0;
  int64_t steps = 0;
  block.set_routing_observer([&](int64_t, int64_t, std::span<const int32_t> experts) {
    std::vector<int64_t> rows(size_t(c.num_experts), 0);
    for (int32_t e : experts) ++rows[size_t(e)];
    most_rows += double(*std::max_element(rows.begin(), rows.end()));
    ++steps;
  });
  const int64_t H = c.hidden_size;
  std::vector<float> x(size_t(kRows * H)), hidden(size_t(kRows * H), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int64_t(i * 7919 % 61) - 30) / 16.0f;
  int64_t layer = 0;
  for (auto _ : state) {
    block.accumulate(layer, x.data(), kRows, hidden.data());
    layer = (layer + 1) % c.num_layers;
  }
  const double flops = 2.0 * double(kRows * c.num_experts_per_tok) * 3.0 * double(H) * double(c.moe_intermediate_size);
  state.counters["expert_GFLOP/s"] =
      benchmark::Counter(flops * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["most_rows"] = steps ? most_rows / double(steps) : 0.0;
}

// The same layer's expert GEMMs alone, as calibrate's expert probe times them (every expert 16 rows, in pieces as
// the lanes cut them, no routing, gather, gate or scatter): what the block's time is set against.
void BM_LaneGemmsAlone(benchmark::State& state) {
  const int threads = int(state.range(0));
  Loaded& l = loaded();
  const auto& c = l.w.config;
  tiering::ExpertCache& cache = l.w.experts->cache();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  const int64_t R = kRows * c.num_experts_per_tok / E;
  kernels::ThreadPool pool(threads), serial(1, false);
  std::vector<std::unique_ptr<kernels::MatmulScratch>> scratch;
  std::vector<std::vector<float>> lanes;
  for (int t = 0; t < threads; ++t) {
    scratch.push_back(std::make_unique<kernels::MatmulScratch>(l.ledger));
    lanes.emplace_back(size_t(R * (2 * I + H)));
  }
  std::vector<float> x(size_t(R * H), 0.25f);
  const int64_t piece = engine::lane_piece_rows(E * R, threads, std::min(engine::kLaneRows, R));
  const int64_t parts = (R + piece - 1) / piece, pieces = E * parts;
  int64_t layer = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) ids[size_t(e)] = int32_t(e);
    cache.request(layer, ids);
    std::vector<tiering::ExpertViews> views;
    for (int64_t e = 0; e < E; ++e) views.push_back(cache.acquire(layer, int32_t(e)));
    std::atomic<int64_t> taken{0};
    pool.parallel_for(std::min<int64_t>(threads, pieces), [&](int64_t, int64_t, int t) {
      kernels::MatmulScratch::Scope scope(*scratch[size_t(t)]);
      float* lane = lanes[size_t(t)].data();
      for (int64_t i = taken.fetch_add(1); i < pieces; i = taken.fetch_add(1)) {
        const tiering::ExpertViews& v = views[size_t(i / parts)];
        const int64_t r0 = (i % parts) * piece, rows = std::min(R, r0 + piece) - r0;
        kernels::matmul(v.gate_up, x.data() + r0 * H, rows, lane, serial);
        kernels::matmul(v.down, lane, rows, lane + R * 2 * I, serial);
      }
    });
    for (int64_t e = 0; e < E; ++e) cache.release(layer, int32_t(e));
    layer = (layer + 1) % c.num_layers;
  }
  const double flops = 2.0 * double(E * R) * 3.0 * double(H) * double(I);
  state.counters["expert_GFLOP/s"] =
      benchmark::Counter(flops * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void args(benchmark::internal::Benchmark* b) {
  const int cores = kernels::ThreadPool::physical_cores();
  for (int lanes : {1, 0})
    for (int routing : {0, 1, 2}) b->Args({lanes, routing, cores});
  b->ArgNames({"lanes", "routing", "threads"});
}

}  // namespace

BENCHMARK(BM_MoePrefillLayer)->Apply(args)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_LaneGemmsAlone)
    ->Arg(kernels::ThreadPool::physical_cores())
    ->ArgName("threads")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();

BENCHMARK_MAIN();
