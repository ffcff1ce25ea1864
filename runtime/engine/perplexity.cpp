// runtime/engine/perplexity.cpp — see perplexity.h.
#include "runtime/engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/engine/forward.h"

namespace tierlm::engine {

double PerplexityResult::perplexity() const { return std::exp(mean_nll); }

PerplexityResult perplexity(const model::ModelWeights& weights, kernels::ThreadPool& pool, tiering::Ledger& ledger,
                            std::span<const int32_t> tokens, const KVCacheOptions& options, int64_t chunk) {
  const int64_t n = int64_t(tokens.size()), V = weights.config.vocab_size;
  if (n < 2) throw std::invalid_argument("perplexity: at least two tokens are needed");
  if (chunk < 1) throw std::invalid_argument("perplexity: chunk must be at least 1");
  if (weights.config.max_position_embeddings > 0 && n > weights.config.max_position_embeddings)
    throw std::invalid_argument("perplexity: " + std::to_string(n) + " tokens, more than the model's " +
                                std::to_string(weights.config.max_position_embeddings) + " positions");
  chunk = std::min(chunk, n);
  Forward forward(weights, pool, ledger, chunk, n);
  KVCacheOptions o = options;
  o.max_chunk = chunk;
  KVCache cache(weights.config, n, ledger, o);
  tiering::LedgerBuffer logits_buffer(ledger, tiering::accounts::scratch, size_t(chunk * V) * sizeof(float));
  float* logits = logits_buffer.as<float>();
  PerplexityResult r;
  r.nll.reserve(size_t(n - 1));
  double sum = 0;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t len = std::min(chunk, n - i);
    forward.run(tokens.subspan(size_t(i), size_t(len)), i, cache, logits, /*all_logits=*/true);
    for (int64_t j = 0; j < len && i + j + 1 < n; ++j) {
      const float* row = &logits[size_t(j * V)];
      const double mx = *std::max_element(row, row + V);
      double s = 0;
      for (int64_t t = 0; t < V; ++t) s += std::exp(double(row[t]) - mx);
      const int32_t next = tokens[size_t(i + j + 1)];
      if (next < 0 || next >= V) throw std::out_of_range("perplexity: token id outside the vocabulary");
      const double nll = mx + std::log(s) - double(row[next]);
      r.nll.push_back(nll);
      sum += nll;
    }
  }
  r.predicted = n - 1;
  r.mean_nll = sum / double(r.predicted);
  return r;
}

}  // namespace tierlm::engine
