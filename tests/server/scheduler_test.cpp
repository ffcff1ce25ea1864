// Scheduler (runtime/engine/scheduler.h) on the tierlm-tiny model: batching, chunked prefill and the prefix cache
// must not change greedy outputs; cancellation, queue limits and finish reasons behave as documented; a sequence's
// constraint masks every token.
// (Lives under tests/server/ because the server is its only client.)
#include "runtime/engine/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <limits>
#include <future>
#include <mutex>
#include <thread>

#include "runtime/kernels/thread_pool.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::engine {
namespace {

std::string model_dir() { return std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny"; }

struct Fixture {
  tiering::Ledger ledger;
  model::ModelWeights weights;
  tok::Tokenizer tokenizer;
  Fixture() : weights(load()), tokenizer(tok::Tokenizer::load(model_dir())) {}
  model::ModelWeights load() {
    model::LoadOptions o;
    o.ledger = &ledger;
    return model::load_model(model_dir(), o);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

struct Collector : SequenceObserver {
  std::vector<int32_t> tokens;
  std::vector<TokenOutput> outputs;
  SequenceResult result;
  std::promise<void> done;
  std::promise<void> first;
  bool first_set = false;
  int64_t stop_after = -1;  // on_token returns false after this many tokens
  bool on_token(const TokenOutput& t) override {
    tokens.push_back(t.token);
    outputs.push_back(t);
    if (!first_set) {
      first_set = true;
      first.set_value();
    }
    return stop_after < 0 || int64_t(tokens.size()) < stop_after;
  }
  void on_finish(const SequenceResult& r) override {
    result = r;
    if (!first_set) {
      first_set = true;
      first.set_value();
    }
    done.set_value();
  }
};

SchedulerOptions options(int64_t max_batch = 4, int64_t prefill = 64) {
  SchedulerOptions o;
  o.context = 256;
  o.max_batch = max_batch;
  o.prefill_size = prefill;
  o.threads = 1;
  o.pin_threads = false;
  return o;
}

SequenceParams greedy(const std::string& text, int64_t max_tokens) {
  SequenceParams p;
  p.prompt = fixture().tokenizer.encode(text, true);
  p.max_tokens = max_tokens;
  return p;
}

std::vector<int32_t> run_alone(Scheduler& s, SequenceParams p) {
  auto c = std::make_shared<Collector>();
  auto f = c->done.get_future();
  s.submit(std::move(p), c);
  f.wait();
  return c->tokens;
}

const std::vector<std::string> kPrompts = {"def add(a, b):", "Return the number of", "class Parser:\n    \"\"\"",
                                           "import os\nimport sys\n\ndef main():"};

TEST(Scheduler, ConcurrentSequencesMatchRunningAlone) {
  auto& f = fixture();
  std::vector<std::vector<int32_t>> alone;
  {
    Scheduler s(f.weights, f.ledger, options(1));
    for (const auto& p : kPrompts) alone.push_back(run_alone(s, greedy(p, 24)));
  }
  Scheduler s(f.weights, f.ledger, options(4));
  std::vector<std::shared_ptr<Collector>> cs;
  std::vector<std::future<void>> fs;
  for (const auto& p : kPrompts) {
    cs.push_back(std::make_shared<Collector>());
    fs.push_back(cs.back()->done.get_future());
    s.submit(greedy(p, 24), cs.back());
  }
  for (auto& x : fs) x.wait();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(cs[i]->tokens, alone[i]) << kPrompts[i];
    EXPECT_EQ(cs[i]->result.finish_reason, "length");
    EXPECT_EQ(cs[i]->result.completion_tokens, 24);
  }
  const auto st = s.stats();
  // Four sequences decoded together: far fewer steps than 4 x 24, and a mean batch above one.
  EXPECT_GT(double(st.batched_rows_total) / double(st.steps_total), 2.0);
}

TEST(Scheduler, ChunkedPrefillMatchesWholePrompt) {
  auto& f = fixture();
  const std::string prompt = "import os\nimport sys\n\ndef main():\n    args = sys.argv[1:]\n    for a in args:";
  std::vector<int32_t> whole, chunked;
  {
    Scheduler s(f.weights, f.ledger, options(1, 256));
    whole = run_alone(s, greedy(prompt, 16));
  }
  {
    Scheduler s(f.weights, f.ledger, options(2, 3));  // 3 prompt tokens per step
    chunked = run_alone(s, greedy(prompt, 16));
    EXPECT_GE(s.stats().steps_total, greedy(prompt, 1).prompt.size() / 3);
  }
  EXPECT_EQ(whole, chunked);
}

TEST(Scheduler, PrefixCacheReusesRowsWithoutChangingOutput) {
  auto& f = fixture();
  const std::string shared = "You are a helpful assistant that writes Python.\nclass Stack:\n    def push(self, x):";
  const std::string second = shared + "\n        self.items.append(x)\n    def pop(self):";
  std::vector<int32_t> fresh;
  {
    Scheduler s(f.weights, f.ledger, options(2));
    fresh = run_alone(s, greedy(second, 12));
  }
  Scheduler s(f.weights, f.ledger, options(2));
  run_alone(s, greedy(shared, 4));
  auto c = std::make_shared<Collector>();
  auto done = c->done.get_future();
  s.submit(greedy(second, 12), c);
  done.wait();
  const int64_t shared_tokens = int64_t(greedy(shared, 1).prompt.size());
  EXPECT_GE(c->result.cached_prompt_tokens, shared_tokens - 1);  // the shared prompt's rows (maybe more)
  EXPECT_LT(c->result.cached_prompt_tokens, c->result.prompt_tokens);
  EXPECT_EQ(c->tokens, fresh);
  EXPECT_EQ(s.stats().cached_tokens_total, uint64_t(c->result.cached_prompt_tokens));
  EXPECT_STREQ(s.stats().prefix_cache, "any_prefix");  // attention only: any common prefix is reused
  // The same prompt again reuses all but its last token.
  auto again = std::make_shared<Collector>();
  auto again_done = again->done.get_future();
  s.submit(greedy(second, 12), again);
  again_done.wait();
  EXPECT_EQ(again->result.cached_prompt_tokens, again->result.prompt_tokens - 1);
  EXPECT_EQ(again->tokens, fresh);
}

TEST(Scheduler, CancelStopsGeneration) {
  auto& f = fixture();
  Scheduler s(f.weights, f.ledger, options(2));
  auto c = std::make_shared<Collector>();
  auto first = c->first.get_future();
  auto done = c->done.get_future();
  SequenceParams p = greedy("def add(a, b):", 200);
  auto handle = s.submit(std::move(p), c);
  first.wait();
  handle->cancel();
  done.wait();
  EXPECT_EQ(c->result.finish_reason, "cancelled");
  EXPECT_LT(c->result.completion_tokens, 200);
  EXPECT_EQ(s.stats().sequences_cancelled, 1u);
  // The slot is free again: another sequence runs to the end.
  auto tokens = run_alone(s, greedy("x = 1", 5));
  EXPECT_EQ(tokens.size(), 5u);
}

TEST(Scheduler, QueueLimitRefusesWithQueueFull) {
  auto& f = fixture();
  auto o = options(1);
  o.queue_limit = 1;
  Scheduler s(f.weights, f.ledger, o);
  auto a = std::make_shared<Collector>();
  auto a_first = a->first.get_future();
  auto a_done = a->done.get_future();
  auto ha = s.submit(greedy("def add(a, b):", 200), a);
  a_first.wait();  // a holds the only slot
  auto b = std::make_shared<Collector>();
  auto b_done = b->done.get_future();
  s.submit(greedy("x", 3), b);  // waits
  EXPECT_THROW(s.submit(greedy("y", 3), std::make_shared<Collector>()), QueueFullError);
  ha->cancel();
  a_done.wait();
  b_done.wait();
  EXPECT_EQ(b->result.finish_reason, "length");
}

// Holds the engine thread in its first on_token until released: its slot stays busy and no step runs, so queue
// states can be set up without racing the model. Then it asks to stop.
struct Gate : Collector {
  std::promise<void> entered, release_promise;
  std::shared_future<void> release = release_promise.get_future().share();
  bool waited = false;
  bool on_token(const TokenOutput& t) override {
    Collector::on_token(t);
    if (!waited) {
      waited = true;
      entered.set_value();
      release.wait();
    }
    return false;
  }
};

// Makes every engine step last at least 2 ms until it is cancelled.
struct Slow : Collector {
  bool on_token(const TokenOutput& t) override {
    Collector::on_token(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return true;
  }
};

// A client that hangs up while queued gives its place back at once, wherever it is in the queue (here behind a
// head that still waits for the slot, so the engine cannot have removed it yet).
TEST(Scheduler, CancelledWaitingSequencesDoNotCountAgainstTheQueueLimit) {
  auto& f = fixture();
  auto o = options(1);
  o.queue_limit = 2;
  Scheduler s(f.weights, f.ledger, o);
  auto gate = std::make_shared<Gate>();
  auto entered = gate->entered.get_future();
  s.submit(greedy("def add(a, b):", 4), gate);
  entered.wait();  // the engine is held, the only slot taken
  auto b = std::make_shared<Collector>();
  auto c = std::make_shared<Collector>();
  auto b_done = b->done.get_future(), c_done = c->done.get_future();
  s.submit(greedy("x", 3), b);
  auto hc = s.submit(greedy("y", 3), c);
  EXPECT_EQ(s.stats().waiting, 2);
  EXPECT_THROW(s.submit(greedy("z", 3), std::make_shared<Collector>()), QueueFullError);
  hc->cancel();
  EXPECT_EQ(s.stats().waiting, 1);
  auto d = std::make_shared<Collector>();
  auto d_done = d->done.get_future();
  bool queued = false;
  EXPECT_NO_THROW({
    s.submit(greedy("z", 3), d);
    queued = true;
  });
  gate->release_promise.set_value();
  b_done.wait();
  c_done.wait();
  if (queued) d_done.wait();
  EXPECT_EQ(b->result.finish_reason, "length");
  EXPECT_EQ(c->result.finish_reason, "cancelled");
  EXPECT_EQ(d->result.finish_reason, queued ? "length" : "");
  EXPECT_EQ(s.stats().waiting, 0);
}

TEST(Scheduler, DeadlineFinishesWithLengthOrTimeout) {
  auto& f = fixture();
  Scheduler s(f.weights, f.ledger, options(1));
  // Running at its deadline: "length" with the tokens it has (>= 2 ms a token: 240 would take 480 ms).
  auto slow = std::make_shared<Slow>();
  auto slow_done = slow->done.get_future();
  SequenceParams p = greedy("def add(a, b):", 240);
  p.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(60);
  s.submit(std::move(p), slow);
  slow_done.wait();
  EXPECT_EQ(slow->result.finish_reason, "length");
  EXPECT_GT(slow->result.completion_tokens, 0);
  EXPECT_LT(slow->result.completion_tokens, 240);
  // Still queued at its deadline: "timeout", nothing generated.
  auto gate = std::make_shared<Gate>();
  auto entered = gate->entered.get_future();
  s.submit(greedy("x", 4), gate);
  entered.wait();
  auto queued = std::make_shared<Collector>();
  auto queued_done = queued->done.get_future();
  SequenceParams q = greedy("y", 4);
  q.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  s.submit(std::move(q), queued);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  gate->release_promise.set_value();
  queued_done.wait();
  EXPECT_EQ(queued->result.finish_reason, "timeout");
  EXPECT_EQ(queued->result.completion_tokens, 0);
  EXPECT_EQ(s.stats().sequences_timed_out, 2u);
}

// When the last running sequences are cancelled the step that removes them runs nothing; the KV figures must still
// drop to zero used (their rows stay cached for prefix reuse).
TEST(Scheduler, KvPositionsUsedReturnsToZeroWhenEverySequenceIsCancelled) {
  auto& f = fixture();
  Scheduler s(f.weights, f.ledger, options(2));
  std::vector<std::shared_ptr<Slow>> cs;
  std::vector<std::shared_ptr<SequenceHandle>> hs;
  std::vector<std::future<void>> firsts, dones;
  for (const char* prompt : {"def add(a, b):", "class Stack:"}) {
    cs.push_back(std::make_shared<Slow>());
    firsts.push_back(cs.back()->first.get_future());
    dones.push_back(cs.back()->done.get_future());
    hs.push_back(s.submit(greedy(prompt, 200), cs.back()));
  }
  for (auto& x : firsts) x.wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(s.stats().kv_positions_used, 0);
  for (auto& h : hs) h->cancel();
  for (auto& x : dones) x.wait();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (s.stats().active != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto st = s.stats();
  EXPECT_EQ(st.active, 0);
  EXPECT_EQ(st.kv_positions_used, 0);
  EXPECT_GT(st.kv_positions_cached, 0);
  EXPECT_EQ(st.sequences_cancelled, 2u);
}

TEST(Scheduler, StatsReportTheResolvedThreadCount) {
  auto& f = fixture();
  auto o = options(1);
  o.threads = 0;  // one per physical core
  {
    Scheduler s(f.weights, f.ledger, o);
    EXPECT_EQ(s.stats().threads, kernels::ThreadPool::physical_cores());
  }
  o.threads = 1;
  Scheduler s(f.weights, f.ledger, o);
  EXPECT_EQ(s.stats().threads, 1);
}

TEST(Scheduler, StopTokensObserverStopAndLength) {
  auto& f = fixture();
  Scheduler s(f.weights, f.ledger, options(2));
  auto first = run_alone(s, greedy("def add(a, b):", 3));
  ASSERT_EQ(first.size(), 3u);
  // A stop token finishes with "stop" and is not reported.
  auto c = std::make_shared<Collector>();
  auto done = c->done.get_future();
  SequenceParams p = greedy("def add(a, b):", 10);
  p.stop_tokens = {first[1]};
  s.submit(std::move(p), c);
  done.wait();
  EXPECT_EQ(c->result.finish_reason, "stop");
  EXPECT_EQ(c->tokens, std::vector<int32_t>{first[0]});
  // The observer asking to stop.
  auto d = std::make_shared<Collector>();
  d->stop_after = 2;
  auto d_done = d->done.get_future();
  s.submit(greedy("def add(a, b):", 10), d);
  d_done.wait();
  EXPECT_EQ(d->result.finish_reason, "stop");
  EXPECT_EQ(d->tokens.size(), 2u);
}

TEST(Scheduler, LogprobsAreNormalizedAndSorted) {
  auto& f = fixture();
  Scheduler s(f.weights, f.ledger, options(1));
  auto c = std::make_shared<Collector>();
  auto done = c->done.get_future();
  SequenceParams p = greedy("def add(a, b):", 4);
  p.top_logprobs = 5;
  s.submit(std::move(p), c);
  done.wait();
  ASSERT_EQ(c->outputs.size(), 4u);
  for (const auto& o : c->outputs) {
    ASSERT_EQ(o.top.size(), 5u);
    EXPECT_EQ(o.top[0].token, o.token);  // greedy picks the most likely token
    EXPECT_FLOAT_EQ(o.top[0].logprob, o.logprob);
    double mass = 0;
    for (size_t i = 0; i < o.top.size(); ++i) {
      EXPECT_LE(o.top[i].logprob, 0.0f);
      if (i) {
        EXPECT_LE(o.top[i].logprob, o.top[i - 1].logprob);
      }
      mass += std::exp(double(o.top[i].logprob));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
}

TEST(Scheduler, RejectsBadSequences) {
  auto& f = fixture();
  Scheduler s(f.weights, f.ledger, options(1));
  SequenceParams empty;
  EXPECT_THROW(s.submit(empty, std::make_shared<Collector>()), std::invalid_argument);
  SequenceParams too_long;
  too_long.prompt.assign(256, 5);
  EXPECT_THROW(s.submit(too_long, std::make_shared<Collector>()), std::invalid_argument);
  SequenceParams bad_token;
  bad_token.prompt = {1, 999999};
  EXPECT_THROW(s.submit(bad_token, std::make_shared<Collector>()), std::invalid_argument);
  // Still serving.
  EXPECT_EQ(run_alone(s, greedy("x", 2)).size(), 2u);
}

// The constraint hook (SequenceParams::constraint): every token, greedy and sampled, comes from the constraint's
// mask (a constraint allowing one scripted token per step, which the model would never pick on its own); the
// sequence ends with "stop" when the constraint is complete, with "length" at max_tokens before that; end tokens
// pass only where the constraint says the text may end.
// Allows exactly script[step] (and, once the script is done, only the end tokens: complete).
struct Scripted : TokenConstraint {
  std::vector<int32_t> script;
  size_t step = 0;
  bool end_allowed_before_complete = false;
  std::vector<int32_t> seen;
  bool mask(std::span<float> logits, std::span<const int32_t> end_tokens) override {
    std::vector<float> keep;
    for (int32_t id : end_tokens) keep.push_back(logits[size_t(id)]);
    const float allowed = step < script.size() ? logits[size_t(script[step])] : 0.0f;
    std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
    if (step < script.size()) logits[size_t(script[step])] = allowed;
    if (end_allowed_before_complete || step >= script.size())
      for (size_t k = 0; k < end_tokens.size(); ++k) logits[size_t(end_tokens[k])] = keep[k];
    return true;
  }
  void accept(int32_t token) override {
    seen.push_back(token);
    ++step;
  }
  bool complete() override { return step >= script.size(); }
};

SequenceResult run_constrained(Scheduler& s, std::shared_ptr<Scripted> constraint, float temperature,
                               int64_t max_tokens, std::vector<int32_t>& tokens, std::vector<int32_t> stops = {}) {
  SequenceParams p;
  p.prompt = fixture().tokenizer.encode("Return the number of", true);
  p.max_tokens = max_tokens;
  p.sampling.temperature = temperature;
  p.sampling.seed = 5;
  p.sampling.has_seed = true;
  p.stop_tokens = std::move(stops);
  p.constraint = constraint;
  auto c = std::make_shared<Collector>();
  auto done = c->done.get_future();
  s.submit(std::move(p), c);
  done.wait();
  tokens = c->tokens;
  return c->result;
}

TEST(SchedulerConstraint, EveryTokenComesFromTheMaskAndCompleteStops) {
  Scheduler s(fixture().weights, fixture().ledger, options());
  const std::vector<int32_t> script = {1500, 7, 1999, 42};  // not what the model writes after this prompt
  for (float temperature : {0.0f, 1.0f}) {
    auto constraint = std::make_shared<Scripted>();
    constraint->script = script;
    std::vector<int32_t> tokens;
    const auto r = run_constrained(s, constraint, temperature, 50, tokens);
    EXPECT_EQ(tokens, script) << "temperature " << temperature;
    EXPECT_EQ(constraint->seen, script);
    EXPECT_EQ(r.finish_reason, "stop");
  }
}

TEST(SchedulerConstraint, MaxTokensBeforeCompleteIsLength) {
  Scheduler s(fixture().weights, fixture().ledger, options());
  auto constraint = std::make_shared<Scripted>();
  constraint->script = {1500, 7, 1999, 42};
  std::vector<int32_t> tokens;
  const auto r = run_constrained(s, constraint, 0.0f, 2, tokens);
  EXPECT_EQ(tokens, (std::vector<int32_t>{1500, 7}));
  EXPECT_EQ(r.finish_reason, "length");
}

TEST(SchedulerConstraint, EndTokensOnlyWhereTheConstraintAllows) {
  Scheduler s(fixture().weights, fixture().ledger, options());
  // A stop token whose logit beats the scripted one (every token is a stop token but the script's): greedy takes
  // it at once when the constraint lets end tokens through, never when it does not.
  std::vector<int32_t> stops;
  for (int32_t id = 0; id < 2048; ++id)
    if (id != 1500) stops.push_back(id);
  for (bool end_allowed : {false, true}) {
    auto constraint = std::make_shared<Scripted>();
    constraint->script = {1500};
    constraint->end_allowed_before_complete = end_allowed;
    std::vector<int32_t> tokens;
    const auto r = run_constrained(s, constraint, 0.0f, 10, tokens, stops);
    EXPECT_EQ(r.finish_reason, "stop");
    if (end_allowed) EXPECT_TRUE(tokens.empty()) << "an end token was allowed and is likelier than token 1500";
    else EXPECT_EQ(tokens, (std::vector<int32_t>{1500}));
  }
}

}  // namespace
}  // namespace tierlm::engine
