// runtime/engine/perplexity.h — how well a model predicts a text with a given KV cache codec: the mean negative
// log-likelihood of each next token (teacher forcing), the prompt fed in chunks whose attention reads every earlier
// position back through the codec, exactly as decode does. Owns nothing beyond one chunk's logits; never samples.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/kv_cache.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::engine {

struct PerplexityResult {
  int64_t predicted = 0;       // tokens scored: every token after the first
  double mean_nll = 0;         // nats per token
  double perplexity() const;   // exp(mean_nll)
  std::vector<double> nll;     // per scored token (position i predicts tokens[i + 1])
};

// tokens.size() >= 2 and <= the model's context; chunk >= 1. The cache (codec from `options`) and the forward pass's
// scratch are charged to `ledger`.
PerplexityResult perplexity(const model::ModelWeights& weights, kernels::ThreadPool& pool, tiering::Ledger& ledger,
                            std::span<const int32_t> tokens, const KVCacheOptions& options, int64_t chunk);

}  // namespace tierlm::engine
