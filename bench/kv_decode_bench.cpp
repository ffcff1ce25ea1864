// bench/kv_decode_bench.cpp — decode tokens/s of the synthetic 1B-class llama with a long context already in the
// KV cache, per KV codec: the cache is filled with random keys/values for `context` positions (encoding them as
// the codec does; filling by prefill would take hours on a laptop-class CPU), then `tokens` decode steps run
// through Forward at the end of that context, so every step attends over the whole context in every layer.
// Run: build-kv/bench/kv_decode_bench [context=32768] [tokens=8] [weights=q8_0] [codecs=f32,f16,q8,turbo3,turbo4]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/engine/forward.h"
#include "runtime/kv/codec.h"
#include "runtime/model/synthetic.h"

using namespace tierlm;

int main(int argc, char** argv) {
  const int64_t context = argc > 1 ? std::atoll(argv[1]) : 32768;
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 8;
  const auto format = kernels::parse_format(argc > 3 ? argv[3] : "q8_0");
  std::vector<kv::Codec> codecs;
  {
    std::stringstream ss(argc > 4 ? argv[4] : "f32,f16,q8,turbo3,turbo4");
    for (std::string name; std::getline(ss, name, ',');) codecs.push_back(kv::parse_codec(name));
  }
  kernels::ThreadPool pool(0);
  tiering::Ledger ledger;
  const model::ModelConfig c = model::llama_1b_config();
  model::ModelWeights m = model::synthetic_model(c, format, ledger);
  std::printf("synthetic 1B llama, %s weights (%.2f GB), %d threads, context %lld, %lld decode steps\n",
              kernels::format_name(format), double(m.bytes()) / 1e9, pool.size(), (long long)context,
              (long long)tokens);
  std::printf("%-7s %10s %12s %10s %12s\n", "codec", "KV GB", "KV B/tok/lyr", "tok/s", "ms/token");
  for (kv::Codec codec : codecs) {
    engine::Forward forward(m, pool, ledger, 1, context + tokens);
    engine::KVCache cache(c, context + tokens, ledger, {codec, {}, {}});
    pool.parallel_for(c.num_layers, [&](int64_t b, int64_t e, int) {
      for (int64_t layer = b; layer < e; ++layer) {
        std::mt19937 rng(uint32_t(layer + 1));
        std::normal_distribution<float> g(0.0f, 1.0f);
        std::vector<float> k(size_t(c.num_kv_heads * c.head_dim)), v(k.size());
        for (int64_t t = 0; t < context; ++t) {
          for (auto& x : k) x = g(rng);
          for (auto& x : v) x = g(rng);
          cache.store(layer, t, k.data(), v.data());
        }
      }
    });
    std::vector<float> logits(size_t(c.vocab_size));
    int32_t token = 1;
    forward.run(std::span(&token, 1), context, cache, logits.data());  // warm-up step
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 1; i < tokens; ++i) {
      token = int32_t((token * 7919 + 13) % c.vocab_size);
      forward.run(std::span(&token, 1), context + i, cache, logits.data());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tps = double(tokens - 1) / seconds;
    std::printf("%-7s %10.3f %12.0f %10.2f %12.1f\n", kv::codec_name(codec), double(cache.bytes()) / 1e9,
                engine::KVCache::bytes_per_token(c, codec), tps, 1e3 / tps);
    std::fflush(stdout);
  }
  return 0;
}
