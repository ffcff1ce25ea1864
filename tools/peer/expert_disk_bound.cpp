// tools/peer/expert_disk_bound.cpp — the disk bound of expert streaming, measured on the model's own files with the
// reads the expert tier issues: the same ExpertStore extents (MLX: nine per expert, 4 KiB aligned), the same
// ExpertReader (io_uring, O_DIRECT, block size and queue depth as the plan's reader), one token's worth of misses
// per layer submitted together (top_k random experts of a random layer), for --seconds.
// Prints one JSON object: experts/s, bytes/s (aligned, as read), bytes per expert, and the cold bound
// tok/s = experts/s / (MoE layers x top_k) (every routed expert a miss). A run's own bound at its measured miss rate
// is experts/s / (misses per token), which the bench computes from /health.
// Owns: nothing but its staging buffers. Never: write to the model folder; allocate outside its own buffers.
//
// Usage: expert_disk_bound MODEL_DIR [--seconds S] [--depth D] [--block BYTES] [--seed N]
//   Drop the page cache before (echo 3 > /proc/sys/vm/drop_caches) where allowed; O_DIRECT bypasses it anyway.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/model/config.h"
#include "runtime/model/moe_model.h"
#include "runtime/model/safetensors.h"
#include "tiering/expert_reader.h"
#include "tiering/expert_store.h"

using namespace tierlm;

namespace {

struct AlignedBuffer {
  void* p = nullptr;
  explicit AlignedBuffer(size_t bytes) {
    if (posix_memalign(&p, 4096, bytes == 0 ? 4096 : bytes) != 0) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw std::invalid_argument("usage: expert_disk_bound MODEL_DIR [--seconds S] [--depth D] [--block BYTES]");
    const std::string dir = argv[1];
    double seconds = 10;
    tiering::ReaderOptions reader_options;
    uint64_t seed = 7;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string key = argv[i], value = argv[i + 1];
      if (key == "--seconds") seconds = std::stod(value);
      else if (key == "--depth") reader_options.queue_depth = unsigned(std::stoul(value));
      else if (key == "--block") reader_options.block_size = std::stoull(value);
      else if (key == "--seed") seed = std::stoull(value);
      else throw std::invalid_argument("unknown option " + key);
    }
    const model::ModelConfig config = model::load_config(dir);
    const model::TensorIndex index = model::TensorIndex::open(dir);
    const tiering::ExpertStore store = model::expert_store_from_safetensors(index, config, std::nullopt);
    tiering::ExpertReader reader(store.files(), reader_options);
    const int64_t k = config.num_experts_per_tok, layers = store.layers(), experts = store.experts();
    // Staging for one token-layer's k experts; plan() targets staging for MLX/dense, the slot for packed.
    const size_t staging = std::max<uint64_t>(store.staging_bytes(), 4096), slot = store.layout().bytes;
    std::vector<std::unique_ptr<AlignedBuffer>> stage, slots;
    for (int64_t i = 0; i < k; ++i) {
      stage.push_back(std::make_unique<AlignedBuffer>(staging));
      slots.push_back(std::make_unique<AlignedBuffer>(slot));
    }
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> pick_layer(0, layers - 1), pick_expert(0, experts - 1);
    uint64_t fetched = 0, bytes = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      const int64_t layer = pick_layer(rng);
      std::vector<tiering::ReadRequest> requests;
      std::vector<int64_t> chosen;
      while (int64_t(chosen.size()) < k) {
        const int64_t e = pick_expert(rng);
        if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
        const size_t j = chosen.size();
        chosen.push_back(e);
        for (const auto& r : store.plan(layer, e, slots[j]->p, stage[j]->p)) requests.push_back(r);
        bytes += store.read_bytes(layer, e);
      }
      reader.wait(reader.submit(requests));
      fetched += uint64_t(k);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    const double eps = double(fetched) / elapsed;
    std::printf("%s\n",
                fmt::format(R"({{"files": {}, "direct": {}, "io_uring": {}, "queue_depth": {}, "block_size": {}, )"
                            R"("moe_layers": {}, "experts": {}, "top_k": {}, "seconds": {:.2f}, "experts_read": {}, )"
                            R"("bytes_per_expert": {}, "experts_per_s": {:.1f}, "gb_per_s": {:.3f}, )"
                            R"("cold_bound_tok_s": {:.3f}}})",
                            store.files().size(), reader.direct(0), reader.using_io_uring(), reader_options.queue_depth,
                            reader_options.block_size, layers, experts, k, elapsed, fetched,
                            store.read_bytes(0, 0), eps, double(bytes) / elapsed / 1e9,
                            eps / double(layers * k))
                    .c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expert_disk_bound: %s\n", e.what());
    return 1;
  }
}
