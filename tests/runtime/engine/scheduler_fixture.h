// tests/runtime/engine/scheduler_fixture.h — driving an engine::Scheduler from a test: random prompts, an observer
// collecting a sequence's tokens and log-probabilities, small scheduler options (prompts in several chunks), and the
// comparison of two runs. Header-only; shared by the scheduler tests of the recurrent and MLA models.
#pragma once

#include <future>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/engine/scheduler.h"

namespace tierlm::fixtures::scheduler {

inline std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(3 + rng() % 250);
  return t;
}

// Collects a sequence's tokens; signals `started` at its `signal_after`-th token (0: never).
struct Collect : engine::SequenceObserver {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  engine::SequenceResult result;
  std::promise<void> done, started;
  size_t signal_after = 0;
  std::shared_ptr<engine::SequenceHandle> handle;
  bool on_token(const engine::TokenOutput& t) override {
    tokens.push_back(t.token);
    logprobs.push_back(t.logprob);
    if (signal_after && tokens.size() == signal_after) started.set_value();
    return true;
  }
  void on_finish(const engine::SequenceResult& r) override {
    result = r;
    done.set_value();
  }
};

inline std::shared_ptr<Collect> start(engine::Scheduler& s, std::vector<int32_t> prompt, int64_t n,
                                      size_t signal_after = 0) {
  engine::SequenceParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = n;
  auto c = std::make_shared<Collect>();
  c->signal_after = signal_after;
  c->handle = s.submit(std::move(p), c);
  return c;
}

inline std::shared_ptr<Collect> generate(engine::Scheduler& s, std::vector<int32_t> prompt, int64_t n) {
  auto c = start(s, std::move(prompt), n);
  c->done.get_future().wait();
  return c;
}

inline engine::SchedulerOptions slots(int64_t n) {
  engine::SchedulerOptions o;
  o.context = 128;
  o.max_batch = n;
  o.prefill_size = 7;  // prompts run in several chunks
  o.threads = 1;
  o.pin_threads = false;
  return o;
}

inline void expect_same(const Collect& cold, const Collect& warm, const char* what) {
  EXPECT_EQ(cold.tokens, warm.tokens) << what;
  for (size_t i = 0; i < cold.logprobs.size() && i < warm.logprobs.size(); ++i)
    EXPECT_NEAR(cold.logprobs[i], warm.logprobs[i], 1e-4) << what << ", token " << i;
}

}  // namespace tierlm::fixtures::scheduler
