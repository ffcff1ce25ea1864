// runtime/engine/generator.h — one sequence's generation loop: chunked prefill of the prompt, then decode steps
// with the sampler until a stop token, max_tokens or the context end. Used by `tierlm run` and the server.
// Owns: the sequence's KV cache and logits buffer. Never: print; tokens go to the callback.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/engine/forward.h"
#include "runtime/engine/sampler.h"

namespace tierlm::engine {

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  std::string finish_reason;  // "stop" | "length"
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? generated_tokens / decode_seconds : 0; }
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // e.g. the model's eos ids
  bool ignore_stop_tokens = false;   // benchmarks generate exactly max_tokens
};

class Generator {
 public:
  Generator(Forward& forward, tiering::Ledger& ledger, int64_t context);
  // on_token(token) returns false to stop early (client gone, stop string matched).
  GenerationStats generate(const GenerationRequest& request, const std::function<bool(int32_t)>& on_token);
  int64_t context() const { return cache_.capacity(); }

 private:
  Forward& forward_;
  KVCache cache_;
  std::vector<float> logits_;
};

}  // namespace tierlm::engine
