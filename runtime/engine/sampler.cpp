#include "runtime/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

namespace tierlm::engine {

void SamplingParams::validate() const {
  auto bad = [](const char* name, const std::string& why) {
    throw std::invalid_argument(fmt::format("{} {}", name, why));
  };
  if (!(temperature >= 0.0f) || temperature > 100.0f) bad("temperature", "must be between 0 and 100");
  if (top_k < 0) bad("top_k", "must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", "must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "must be in [0, 1]");
  if (!(repetition_penalty > 0.0f)) bad("repetition_penalty", "must be > 0");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) bad("presence_penalty", "must be in [-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) bad("frequency_penalty", "must be in [-2, 2]");
  for (const auto& [token, bias] : logit_bias)
    if (token < 0 || !(bias >= -100.0f && bias <= 100.0f)) bad("logit_bias", "needs token ids >= 0 and biases in [-100, 100]");
}

int64_t argmax(std::span<const float> values) {
  const float* a = values.data();
  const int64_t n = int64_t(values.size());
  constexpr int kLanes = 16;
  if (n < kLanes) return std::max_element(a, a + n) - a;
  float best[kLanes];
  for (int j = 0; j < kLanes; ++j) best[j] = a[j];
  int64_t i = kLanes;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) best[j] = a[i + j] > best[j] ? a[i + j] : best[j];
  float m = best[0];
  for (int j = 1; j < kLanes; ++j) m = best[j] > m ? best[j] : m;
  for (; i < n; ++i) m = a[i] > m ? a[i] : m;
  if (m != m) {  // lane maxima start from the first values, so a leading NaN can survive: rescan without it
    m = -INFINITY;
    bool any = false;
    for (int64_t k = 0; k < n; ++k)
      if (a[k] == a[k] && (!any || a[k] > m)) m = a[k], any = true;
    if (!any) return 0;
  }
  for (int64_t k = 0; k < n; ++k)
    if (a[k] == m) return k;
  return 0;
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  params_.validate();
  rng_.seed(params.has_seed ? params.seed : std::random_device{}());
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const int64_t n = int64_t(logits.size());
  if (n == 0) throw std::invalid_argument("sampler: empty logits");
  if (plain_greedy()) return int32_t(argmax(logits));  // no copy
  const bool penalties =
      params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  work_.assign(logits.begin(), logits.end());
  for (const auto& [token, bias] : params_.logit_bias)
    if (token < n) work_[size_t(token)] += bias;
  if (penalties) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history)
      if (t >= 0 && t < n) ++counts[t];
    for (auto [t, count] : counts) {
      float& l = work_[size_t(t)];
      if (params_.repetition_penalty != 1.0f)
        l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
      l -= params_.presence_penalty + params_.frequency_penalty * float(count);
    }
  }
  if (params_.temperature == 0.0f) return int32_t(argmax(work_));

  // Candidates sorted by logit, truncated by top-k; then softmax at the temperature; then top-p and min-p.
  order_.resize(size_t(n));
  std::iota(order_.begin(), order_.end(), 0);
  int64_t keep = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, n) : n;
  auto by_logit = [&](int32_t a, int32_t b) { return work_[size_t(a)] > work_[size_t(b)]; };
  if (keep == n && params_.min_p <= 0.0f && params_.top_p >= 1.0f) return sample_untruncated(by_logit);
  if (keep == n) return sample_nucleus(by_logit);
  std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
  const float max_logit = work_[size_t(order_[0])];
  probs_.resize(static_cast<size_t>(keep));
  auto& probs = probs_;
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[size_t(i)] = std::exp(double(work_[size_t(order_[size_t(i)])] - max_logit) / params_.temperature);
    sum += probs[size_t(i)];
  }
  for (auto& p : probs) p /= sum;
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * probs[0];
    int64_t k = 1;
    while (k < keep && probs[size_t(k)] >= floor) ++k;
    keep = k;
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    int64_t k = 0;
    while (k < keep) {
      cumulative += probs[size_t(k)];
      ++k;
      if (cumulative >= params_.top_p) break;
    }
    keep = k;
  }
  return draw(size_t(keep), [&](size_t i) { return probs[i]; });
}

// One draw among the `keep` first ranks of order_, rank i weighing prob(i): the rank where the running sum passes a
// uniform draw below their total.
template <class Prob>
int32_t Sampler::draw(size_t keep, const Prob& prob) {
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += prob(i);
  std::uniform_real_distribution<double> uniform(0.0, total);
  const double r = uniform(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob(i);
    if (r < acc) return order_[i];
  }
  return order_[keep - 1];
}

// probs_[t] = exp((work_[t] - the largest) / temperature) for every token t; returns their sum.
double Sampler::weigh_by_token() {
  const size_t n = work_.size();
  const float max_logit = *std::max_element(work_.begin(), work_.end());
  probs_.resize(n);
  double total = 0;
  for (size_t t = 0; t < n; ++t) total += probs_[t] = std::exp(double(work_[t] - max_logit) / params_.temperature);
  return total;
}

// The rank, in descending logit order, at which the running sum of probs_ (by token) first passes `target` (reaches
// it when `inclusive`), without sorting the whole order: a quickselect by halves keeps only the part of order_ that
// holds the crossing (the tokens ranked before it are summed, not ordered). On return order_[0, rank] holds the
// rank + 1 most likely tokens, and the ones around the crossing are sorted. The last rank when rounding never passes.
template <class ByLogit>
size_t Sampler::crossing_rank(const ByLogit& by_logit, double target, bool inclusive) {
  auto passes = [&](double sum) { return inclusive ? sum >= target : sum > target; };
  // order_[lo, hi): the undecided ranks; the tokens ranked before lo sum to `before`.
  size_t lo = 0, hi = order_.size();
  double before = 0;
  while (hi - lo > 64) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(order_.begin() + std::ptrdiff_t(lo), order_.begin() + std::ptrdiff_t(mid),
                     order_.begin() + std::ptrdiff_t(hi), by_logit);
    double upper = 0;
    for (size_t i = lo; i < mid; ++i) upper += probs_[size_t(order_[i])];
    if (passes(before + upper)) {
      hi = mid;
    } else {
      before += upper;
      lo = mid;
    }
  }
  std::sort(order_.begin() + std::ptrdiff_t(lo), order_.begin() + std::ptrdiff_t(hi), by_logit);
  double acc = before;
  for (size_t i = lo; i < hi; ++i) {
    acc += probs_[size_t(order_[i])];
    if (passes(acc)) return i;
  }
  return hi - 1;
}

// The whole vocabulary, walked in descending logit order as above (the token where the running sum passes the draw),
// without sorting it (crossing_rank): a 152K vocabulary costs two passes instead of a sort (~10 ms a token).
template <class ByLogit>
int32_t Sampler::sample_untruncated(const ByLogit& by_logit) {
  std::uniform_real_distribution<double> uniform(0.0, weigh_by_token());
  return order_[crossing_rank(by_logit, uniform(rng_), false)];
}

// Top-p and/or min-p over the whole vocabulary, walked as above (the descending order cut at min-p's floor and at
// the shortest prefix whose probability reaches top-p, then the draw over what is kept), without sorting all of it:
// min-p's cut is a count of the tokens at or above the floor, top-p's crossing is crossing_rank's, and only the kept
// tokens are sorted. A 152K vocabulary at top_p 0.9 sorted all 152K tokens for each draw before (~11 ms on the
// 2-core VM).
template <class ByLogit>
int32_t Sampler::sample_nucleus(const ByLogit& by_logit) {
  const size_t n = work_.size();
  const double sum = weigh_by_token();
  for (double& p : probs_) p /= sum;
  size_t keep = n, bound = n;  // order_[0, bound) holds the `bound` most likely tokens (in some order)
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * (1.0 / sum);  // the most likely token's probability is exp(0) / sum
    keep = size_t(std::count_if(probs_.begin(), probs_.end(), [&](double p) { return p >= floor; }));
  }
  if (params_.top_p < 1.0f) {
    bound = crossing_rank(by_logit, params_.top_p, true) + 1;
    keep = std::min(keep, bound);
  }
  keep = std::max<size_t>(keep, 1);
  // The `keep` most likely tokens first, in descending order.
  std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(keep - 1), order_.begin() + std::ptrdiff_t(bound),
                   by_logit);
  std::sort(order_.begin(), order_.begin() + std::ptrdiff_t(keep), by_logit);
  return draw(keep, [&](size_t i) { return probs_[size_t(order_[i])]; });
}

}  // namespace tierlm::engine
