#include "runtime/engine/sampler.h"

#include <cmath>
#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

using namespace tierlm::engine;

TEST(Sampler, GreedyPicksArgmax) {
  Sampler s(SamplingParams{});
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 2.9f};
  EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(Sampler, SeedMakesDrawsReproducible) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  p.has_seed = true;
  std::vector<float> logits(100);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, {}), b.sample(logits, {}));
}

TEST(Sampler, FrequenciesFollowSoftmaxAtTemperature) {
  // Known math: with logits log(1), log(2), log(7) and T=1 the probabilities are 0.1, 0.2, 0.7.
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  p.has_seed = true;
  Sampler s(p);
  std::vector<float> logits = {0.0f, float(std::log(2.0)), float(std::log(7.0))};
  std::map<int, int> counts;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) counts[s.sample(logits, {})]++;
  EXPECT_NEAR(counts[0] / double(draws), 0.1, 0.015);
  EXPECT_NEAR(counts[1] / double(draws), 0.2, 0.015);
  EXPECT_NEAR(counts[2] / double(draws), 0.7, 0.015);
}

TEST(Sampler, TopKTopPMinPTruncate) {
  std::vector<float> logits = {0.0f, float(std::log(2.0)), float(std::log(7.0)), -50.0f};
  auto support = [&](SamplingParams p) {
    p.temperature = 1.0f;
    p.has_seed = true;
    Sampler s(p);
    std::map<int, int> counts;
    for (int i = 0; i < 3000; ++i) counts[s.sample(logits, {})]++;
    return counts.size();
  };
  SamplingParams k;
  k.top_k = 2;
  EXPECT_EQ(support(k), 2u);
  SamplingParams top_p;
  top_p.top_p = 0.75f;  // 0.7 then 0.7+0.2 >= 0.75
  EXPECT_EQ(support(top_p), 2u);
  SamplingParams min_p;
  min_p.min_p = 0.2f;  // floor 0.14: keeps 0.7 and 0.2
  EXPECT_EQ(support(min_p), 2u);
}

TEST(Sampler, PenaltiesDiscourageRepeats) {
  std::vector<float> logits = {1.0f, 1.1f};
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  Sampler s(p);
  std::vector<int32_t> history = {1};
  EXPECT_EQ(s.sample(logits, history), 0);
  SamplingParams r;
  r.repetition_penalty = 1.2f;
  Sampler s2(r);
  EXPECT_EQ(s2.sample(logits, history), 0);  // 1.1 / 1.2 < 1.0
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
  p = {};
  p.temperature = NAN;
  EXPECT_THROW(Sampler{p}, std::invalid_argument);
}

// The fast argmax against std::max_element (first maximum on ties) on every length up to 70 and a 128K vocabulary,
// with ties, negative values and -inf; NaNs are skipped.
TEST(Sampler, ArgmaxMatchesMaxElement) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-6, 6);  // many ties
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 47, 64, 70, 128256}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = float(small(rng)) - (trial % 3 == 0 ? 100.0f : 0.0f);
      if (trial % 5 == 0) v[size_t(rng() % size_t(n))] = -INFINITY;
      EXPECT_EQ(tierlm::engine::argmax(v), std::max_element(v.begin(), v.end()) - v.begin()) << "n=" << n;
    }
  }
  std::vector<float> with_nan = {std::nanf(""), 1.0f, 3.0f, std::nanf(""), 3.0f, 2.0f};
  for (int i = 0; i < 20; ++i) with_nan.push_back(-1.0f);
  EXPECT_EQ(tierlm::engine::argmax(with_nan), 2);
  EXPECT_EQ(tierlm::engine::argmax(std::vector<float>(20, std::nanf(""))), 0);
}

// logit_bias is added to the logits before everything else: exact math on a three-token distribution.
TEST(Sampler, LogitBiasShiftsTheDistribution) {
  std::vector<float> logits = {0.0f, float(std::log(2.0)), float(std::log(7.0))};
  SamplingParams greedy;
  greedy.logit_bias = {{0, 3.0f}};  // 0 + 3 > log 7: greedy now picks token 0
  Sampler g(greedy);
  EXPECT_FALSE(g.plain_greedy());
  EXPECT_EQ(g.sample(logits, {}), 0);
  // Biasing token 2 by log(2/7) and token 0 by log(2) makes all three logits log(2): 1/3 each; -100 bans one.
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 11;
  p.has_seed = true;
  p.logit_bias = {{2, float(std::log(2.0 / 7.0))}, {0, float(std::log(2.0))}};
  Sampler s(p);
  std::map<int, int> counts;
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) counts[s.sample(logits, {})]++;
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(counts[t] / double(draws), 1.0 / 3.0, 0.015) << t;
  p.logit_bias = {{2, -100.0f}};
  Sampler banned(p);
  for (int i = 0; i < 2000; ++i) EXPECT_NE(banned.sample(logits, {}), 2);
  SamplingParams bad;
  bad.logit_bias = {{1, 101.0f}};
  EXPECT_THROW(Sampler{bad}, std::invalid_argument);
}

namespace {

// Qwen3's vocabulary of random logits with one banned token (logit_bias -100 or a grammar mask: -inf), and its
// order by logit, highest first: what the samplers before the quickselect walked.
struct SortedVocabulary {
  std::vector<float> logits;
  std::vector<int32_t> order;
};

SortedVocabulary sorted_vocabulary(unsigned seed, size_t banned) {
  SortedVocabulary v;
  const size_t n = 151936;
  std::mt19937 fill(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  v.logits.resize(n);
  for (float& l : v.logits) l = normal(fill);
  v.logits[banned] = -INFINITY;
  v.order.resize(n);
  std::iota(v.order.begin(), v.order.end(), 0);
  std::sort(v.order.begin(), v.order.end(),
            [&](int32_t a, int32_t b) { return v.logits[size_t(a)] > v.logits[size_t(b)]; });
  return v;
}

// exp((logit - the largest) / temperature) by rank.
std::vector<double> ranked_weights(const SortedVocabulary& v, float temperature) {
  std::vector<double> w(v.order.size());
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::exp(double(v.logits[size_t(v.order[i])] - v.logits[size_t(v.order[0])]) / temperature);
  return w;
}

struct WalkComparison {
  int differ = 0;               // draws where the sampler picked another token than the walk
  std::set<int32_t> picked;     // what the sampler picked
};

// `draws` tokens from `s` against the sorted walk over ranks [0, keep) weighted by `weights`, for the same draws:
// the same generator, seeded as the sampler is, drawing uniform(0, total) once per token.
WalkComparison compare_with_sorted_walk(Sampler& s, const SortedVocabulary& v, const std::vector<double>& weights,
                                        size_t keep, int draws) {
  std::mt19937_64 rng(s.params().seed);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += weights[i];
  WalkComparison c;
  for (int draw = 0; draw < draws; ++draw) {
    std::uniform_real_distribution<double> uniform(0.0, total);
    const double r = uniform(rng);
    double acc = 0;
    size_t i = 0;
    while (i + 1 < keep && r >= (acc += weights[i])) ++i;
    const int32_t got = s.sample(v.logits, {});
    c.differ += got != v.order[i];
    c.picked.insert(got);
  }
  return c;
}

}  // namespace

// Without top-k, top-p or min-p the sampler finds the drawn token by quickselect instead of sorting the vocabulary;
// it must pick what walking the fully sorted order picks (the earlier algorithm, written out here) for the same draw.
TEST(Sampler, UntruncatedDrawsPickWhatTheSortedWalkPicks) {
  const SortedVocabulary v = sorted_vocabulary(3, 17);
  for (float temperature : {0.3f, 0.8f, 1.5f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 11;
    p.has_seed = true;
    Sampler s(p);
    const WalkComparison c = compare_with_sorted_walk(s, v, ranked_weights(v, temperature), v.order.size(), 300);
    EXPECT_EQ(c.picked.count(17), 0u) << "the banned token was drawn";
    // Sums taken in another order round differently: a draw within ~1e-16 of a boundary could fall either side.
    EXPECT_EQ(c.differ, 0) << "temperature " << temperature;
  }
}

// Top-p and min-p without top-k (what most clients send) keep what the full sort kept and draw the same token: the
// oracle is the walk over the whole vocabulary sorted by logit, cut at min-p's floor and at top-p's crossing.
TEST(Sampler, NucleusDrawsPickWhatTheSortedWalkPicks) {
  const SortedVocabulary v = sorted_vocabulary(5, 23);
  const float temperature = 0.7f;
  std::vector<double> probs = ranked_weights(v, temperature);
  double sum = 0;
  for (double q : probs) sum += q;
  for (double& q : probs) q /= sum;
  for (float top_p : {0.5f, 0.9f, 0.999f, 1.0f})
    for (float min_p : {0.0f, 0.02f, 0.2f}) {
      if (top_p == 1.0f && min_p == 0.0f) continue;  // the untruncated walk (tested above)
      SamplingParams p;
      p.temperature = temperature;
      p.top_p = top_p;
      p.min_p = min_p;
      p.seed = 19;
      p.has_seed = true;
      Sampler s(p);
      size_t keep = probs.size();
      if (min_p > 0) {
        size_t k = 1;
        while (k < keep && probs[k] >= min_p * probs[0]) ++k;
        keep = k;
      }
      if (top_p < 1) {
        double cumulative = 0;
        size_t k = 0;
        while (k < keep) {
          cumulative += probs[k++];
          if (cumulative >= top_p) break;
        }
        keep = k;
      }
      const WalkComparison c = compare_with_sorted_walk(s, v, probs, keep, 60);
      EXPECT_EQ(c.picked.count(23), 0u) << "the banned token was drawn";
      EXPECT_EQ(c.differ, 0) << "top_p " << top_p << " min_p " << min_p << " keep " << keep;
      EXPECT_LE(c.picked.size(), keep);
    }
}
