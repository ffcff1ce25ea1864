// bench/expert_miss_bench.cpp — what one expert miss costs the forward thread, split into the wait for its read and
// the conversion of the read bytes into the slot format (ExpertStore::finish), on a real model folder's expert tier.
// It drives the tier the way a decode step does: per round a random layer's top_k distinct random experts are
// requested together (their reads start at once, io_uring + O_DIRECT at the reader's depth and block), then acquired
// one after the other (the first waits for its read, is converted, the next ones' reads land meanwhile) and released.
// The cache has top_k slots and no resident set, so nearly every request misses. Uses the tier's own counters
// (read_stall_seconds, conversion_seconds, the ones /health publishes), so the numbers are the server's.
// A DIR/experts.tierlm (`tierlm pack`) is used when present, unless --no-packed.
// --compute multiplies every acquired expert (gate_up, then down on the first half of its output) on one unpinned
// thread as decode would, and --hits H adds H resident experts per round (experts 0..H-1 of every layer, requested
// with the misses and computed first, while the misses' reads are in flight): the forward thread then has work to
// overlap with the conversions, which run on the cache's worker unless --inline (the comparison baseline: inside
// acquire(), on the forward thread).
//
// Usage: expert_miss_bench MODEL_DIR [--rounds N] [--top-k K] [--depth D] [--block BYTES] [--seed S] [--no-packed]
//                          [--compute] [--hits H] [--inline]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/moe_model.h"
#include "runtime/model/safetensors.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/kernels/weights.h"

using namespace tierlm;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [--rounds N] [--top-k K] [--depth D] [--block BYTES] [--seed S] "
                         "[--no-packed]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  int rounds = 64, top_k = 0, hits = 0;
  unsigned seed = 1;
  bool compute = false;
  model::LoadOptions options;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--rounds") rounds = std::atoi(value());
    else if (a == "--top-k") top_k = std::atoi(value());
    else if (a == "--depth") options.experts.reader.queue_depth = unsigned(std::atoi(value()));
    else if (a == "--block") options.experts.reader.block_size = std::strtoull(value(), nullptr, 10);
    else if (a == "--seed") seed = unsigned(std::atoi(value()));
    else if (a == "--no-packed") options.packed_experts = std::filesystem::path();
    else if (a == "--compute") compute = true;
    else if (a == "--hits") hits = std::atoi(value());
    else if (a == "--inline") options.experts.cache.convert_on_worker = false;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const model::ModelConfig config = model::load_config(dir);
  if (!config.arch.moe) {
    std::fprintf(stderr, "%s: not a MoE model\n", dir.c_str());
    return 2;
  }
  if (top_k <= 0) top_k = int(config.num_experts_per_tok);
  options.experts.cache.slots = top_k;
  options.experts.cache.prefetch_limit = 0;
  if (hits < 0 || hits + top_k > config.num_experts) {
    std::fprintf(stderr, "--hits must leave top_k experts to miss\n");
    return 2;
  }
  for (int64_t layer = 0; layer < config.num_layers; ++layer)
    for (int32_t e = 0; e < hits; ++e) options.experts.cache.resident.push_back({layer, e});
  const model::TensorIndex index = model::TensorIndex::open(dir);
  tiering::Ledger ledger;
  auto tier = model::open_expert_tier(dir, index, config, options, ledger);
  tiering::ExpertCache& cache = tier->cache();
  const tiering::ExpertStore& store = tier->store();

  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick_layer(0, store.layers() - 1);
  std::uniform_int_distribution<int32_t> pick_expert(hits, int32_t(store.experts()) - 1);
  kernels::ThreadPool pool(1, /*pin=*/false);
  const int64_t H = store.layout().hidden, I = store.layout().intermediate;
  std::vector<float> x(static_cast<size_t>(H), 0.01f), ffn(static_cast<size_t>(2 * I)), out(static_cast<size_t>(H));
  double compute_seconds = 0;
  auto multiply = [&](const tiering::ExpertViews& v) {
    if (!compute) return;
    const auto t0 = std::chrono::steady_clock::now();
    kernels::matvec(v.gate_up, x.data(), ffn.data(), pool);
    kernels::matvec(v.down, ffn.data(), out.data(), pool);
    compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  cache.reset_counters();
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < rounds; ++round) {
    const int64_t layer = pick_layer(rng);
    std::vector<int32_t> experts;
    for (int32_t e = 0; e < hits; ++e) experts.push_back(e);
    while (int(experts.size()) < hits + top_k) {
      const int32_t e = pick_expert(rng);
      if (std::find(experts.begin(), experts.end(), e) == experts.end()) experts.push_back(e);
    }
    cache.request(layer, experts);
    for (int32_t e : experts) {
      const tiering::ExpertViews v = cache.acquire(layer, e);
      if (v.gate_up.data == nullptr) return 1;
      multiply(v);
      cache.release(layer, e);
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const tiering::ExpertTierTelemetry t = tier->telemetry();
  const double misses = double(t.misses ? t.misses : 1);
  const char* encoding = store.encoding() == tiering::ExpertEncoding::packed ? "packed" : "safetensors";
  std::printf("model %s: %s experts, slot %s %llu B, read %llu B per miss (first expert), reader depth %u block %llu\n",
              dir.c_str(), encoding, kernels::format_name(store.layout().format),
              (unsigned long long)store.layout().bytes, (unsigned long long)store.read_bytes(0, 0),
              options.experts.reader.queue_depth, (unsigned long long)options.experts.reader.block_size);
  std::printf("rounds %d x top_k %d: misses %llu, hits %llu, bytes read %llu, wall %.3f s\n", rounds, top_k,
              (unsigned long long)t.misses, (unsigned long long)t.hits, (unsigned long long)t.bytes_read, wall);
  // The forward thread's time: its read wait, the conversions it did itself, its wait for the worker's, the experts'
  // matvecs, the rest (bookkeeping). The worker's conversions (conversion - inline) overlap these.
  const double forward_conversion = t.inline_conversion_seconds + t.conversion_wait_seconds;
  std::printf("per miss: wall %.2f ms = read wait %.2f ms + conversion on the forward thread %.2f ms (own %.2f, "
              "waiting for the worker %.2f) + compute %.2f ms + other %.2f ms; conversion CPU %.2f ms (%llu of %llu "
              "on the forward thread); disk %.3f GB/s\n",
              1e3 * wall / misses, 1e3 * t.read_stall_seconds / misses, 1e3 * forward_conversion / misses,
              1e3 * t.inline_conversion_seconds / misses, 1e3 * t.conversion_wait_seconds / misses,
              1e3 * compute_seconds / misses,
              1e3 * (wall - t.read_stall_seconds - forward_conversion - compute_seconds) / misses,
              1e3 * t.conversion_seconds / misses, (unsigned long long)t.inline_conversions,
              (unsigned long long)t.conversions, double(t.bytes_read) / wall * 1e-9);
  std::printf("{\"misses\": %llu, \"wall_s\": %.6f, \"read_wait_s\": %.6f, \"conversion_s\": %.6f, "
              "\"inline_conversion_s\": %.6f, \"conversion_wait_s\": %.6f, \"compute_s\": %.6f, \"bytes_read\": %llu, "
              "\"conversions\": %llu, \"inline_conversions\": %llu, \"worker\": %s}\n",
              (unsigned long long)t.misses, wall, t.read_stall_seconds, t.conversion_seconds,
              t.inline_conversion_seconds, t.conversion_wait_seconds, compute_seconds,
              (unsigned long long)t.bytes_read, (unsigned long long)t.conversions,
              (unsigned long long)t.inline_conversions, options.experts.cache.convert_on_worker ? "true" : "false");
  return 0;
}
