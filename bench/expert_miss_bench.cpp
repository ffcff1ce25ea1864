// bench/expert_miss_bench.cpp — what one expert miss costs the forward thread, split into the wait for its read and
// the conversion of the read bytes into the slot format (ExpertStore::finish), on a real model folder's expert tier.
// It drives the tier the way a decode step does: per round a random layer's top_k distinct random experts are
// requested together (their reads start at once, io_uring + O_DIRECT at the reader's depth and block), then acquired
// one after the other (the first waits for its read, is converted, the next ones' reads land meanwhile) and released.
// The cache has top_k slots and no resident set, so nearly every request misses. Uses the tier's own counters
// (read_stall_seconds, conversion_seconds, the ones /health publishes), so the numbers are the server's.
// A DIR/experts.tierlm (`tierlm pack`) is used when present, unless --no-packed.
//
// Usage: expert_miss_bench MODEL_DIR [--rounds N] [--top-k K] [--depth D] [--block BYTES] [--seed S] [--no-packed]
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

using namespace tierlm;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [--rounds N] [--top-k K] [--depth D] [--block BYTES] [--seed S] "
                         "[--no-packed]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  int rounds = 64, top_k = 0;
  unsigned seed = 1;
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
  const model::TensorIndex index = model::TensorIndex::open(dir);
  tiering::Ledger ledger;
  auto tier = model::open_expert_tier(dir, index, config, options, ledger);
  tiering::ExpertCache& cache = tier->cache();
  const tiering::ExpertStore& store = tier->store();

  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick_layer(0, store.layers() - 1);
  std::uniform_int_distribution<int32_t> pick_expert(0, int32_t(store.experts()) - 1);
  cache.reset_counters();
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < rounds; ++round) {
    const int64_t layer = pick_layer(rng);
    std::vector<int32_t> experts;
    while (int(experts.size()) < top_k) {
      const int32_t e = pick_expert(rng);
      if (std::find(experts.begin(), experts.end(), e) == experts.end()) experts.push_back(e);
    }
    cache.request(layer, experts);
    for (int32_t e : experts) {
      const tiering::ExpertViews v = cache.acquire(layer, e);
      if (v.gate_up.data == nullptr) return 1;
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
  std::printf("per miss: wall %.2f ms = read wait %.2f ms + conversion %.2f ms + other %.2f ms; disk %.3f GB/s\n",
              1e3 * wall / misses, 1e3 * t.read_stall_seconds / misses, 1e3 * t.conversion_seconds / misses,
              1e3 * (wall - t.read_stall_seconds - t.conversion_seconds) / misses, double(t.bytes_read) / wall * 1e-9);
  std::printf("{\"misses\": %llu, \"wall_s\": %.6f, \"read_wait_s\": %.6f, \"conversion_s\": %.6f, \"bytes_read\": %llu, "
              "\"conversions\": %llu}\n",
              (unsigned long long)t.misses, wall, t.read_stall_seconds, t.conversion_seconds,
              (unsigned long long)t.bytes_read, (unsigned long long)t.conversions);
  return 0;
}
