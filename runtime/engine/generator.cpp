#include "runtime/engine/generator.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/gpu/gpu_layers.h"

namespace tierlm::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Generator::Generator(Forward& forward, tiering::Ledger& ledger, int64_t context)
    : forward_(forward), cache_(forward.weights().config, context, ledger, [&] {
        KVCacheOptions o;
        o.max_chunk = forward.max_chunk();  // generate() feeds chunks of at most this
        o.first_layer = forward.gpu() ? forward.gpu()->layers() : 0;  // the GPU layers keep their own KV and states
        return o;
      }()),
      logits_(static_cast<size_t>(forward.weights().config.vocab_size)) {}

GenerationStats Generator::generate(const GenerationRequest& request, const std::function<bool(int32_t)>& on_token) {
  GenerationStats stats;
  const int64_t n = int64_t(request.prompt.size());
  if (n == 0) throw std::invalid_argument("the prompt is empty (no tokens to condition on)");
  if (n >= cache_.capacity())
    throw std::invalid_argument(fmt::format("the prompt has {} tokens but the context holds {}", n,
                                            cache_.capacity()));
  if (request.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  Sampler sampler(request.sampling);
  std::vector<int32_t> history(request.prompt);

  // Greedy decoding asks Forward for the argmax itself (a GPU head then sends back the token, not the logits).
  const bool greedy = sampler.plain_greedy();
  int32_t greedy_token = -1;
  auto forward = [&](std::span<const int32_t> tokens, int64_t pos) {
    const BatchItem item{tokens, pos, &cache_, logits_.data(), false, greedy ? &greedy_token : nullptr};
    forward_.run_batch(std::span(&item, 1));
  };

  auto t0 = std::chrono::steady_clock::now();
  const int64_t chunk = forward_.max_chunk();
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t len = std::min(chunk, n - i);
    forward(std::span(request.prompt).subspan(size_t(i), size_t(len)), i);
  }
  stats.prompt_tokens = n;
  stats.prefill_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  int64_t pos = n;
  stats.finish_reason = "length";
  while (stats.generated_tokens < request.max_tokens) {
    const int32_t token = greedy ? greedy_token : sampler.sample(logits_, history);
    history.push_back(token);
    ++stats.generated_tokens;
    const bool is_stop = !request.ignore_stop_tokens &&
        std::find(request.stop_tokens.begin(), request.stop_tokens.end(), token) != request.stop_tokens.end();
    if (is_stop) {
      stats.finish_reason = "stop";
      break;
    }
    if (!on_token(token)) {
      stats.finish_reason = "stop";
      break;
    }
    if (stats.generated_tokens == request.max_tokens) break;
    if (pos + 1 > cache_.capacity()) break;  // context full: finish with "length"
    forward(std::span(&token, 1), pos);
    ++pos;
  }
  stats.decode_seconds = seconds_since(t0);
  return stats;
}

}  // namespace tierlm::engine
