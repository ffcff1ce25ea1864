// runtime/engine/sampler.h — turns logits into the next token: logit_bias, repetition/presence/frequency penalties,
// temperature, top-k, top-p, min-p, then a seeded draw (greedy when temperature is 0).
// Owns: its RNG and a reusable candidate buffer. Never: modify the caller's logits.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tierlm::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;  // HF-style: divide positive / multiply negative logits of seen tokens
  float presence_penalty = 0.0f;    // OpenAI-style: subtract once per seen token
  float frequency_penalty = 0.0f;   // OpenAI-style: subtract per occurrence
  uint64_t seed = 0;
  bool has_seed = false;
  // OpenAI's logit_bias: added to a token's logit before everything else (-100 bans it, 100 all but forces it).
  // Ids past the logits' end are ignored here; the server refuses them against the vocabulary first.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Throws std::invalid_argument naming the parameter when a value is out of range.
  void validate() const;
};

// Index of the largest value, the first one on ties (as std::max_element), NaNs ignored unless all are NaN; about
// 10x faster than std::max_element on a 128K vocabulary (independent lane maxima, then a search for the first
// index holding the maximum). The greedy path of every decode step.
int64_t argmax(std::span<const float> values);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // history: tokens seen so far (prompt + generated) for the penalties.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  const SamplingParams& params() const { return params_; }
  // True when sample() is the plain argmax of the logits (temperature 0, no penalties, no bias).
  bool plain_greedy() const {
    return params_.temperature == 0.0f && params_.repetition_penalty == 1.0f && params_.presence_penalty == 0.0f &&
           params_.frequency_penalty == 0.0f && params_.logit_bias.empty();
  }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  template <class ByLogit>
  int32_t sample_untruncated(const ByLogit& by_logit);  // no top-k, top-p or min-p: no full sort
  template <class ByLogit>
  int32_t sample_nucleus(const ByLogit& by_logit);  // top-p and/or min-p without top-k: sorts the kept tokens only
  template <class ByLogit>
  size_t crossing_rank(const ByLogit& by_logit, double target, bool inclusive);  // see sampler.cpp
  double weigh_by_token();  // see sampler.cpp
  template <class Prob>
  int32_t draw(size_t keep, const Prob& prob);  // see sampler.cpp

  std::vector<float> work_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace tierlm::engine
