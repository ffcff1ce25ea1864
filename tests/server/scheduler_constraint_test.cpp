// The scheduler's constraint hook (SequenceParams::constraint) on the tierlm-tiny model: every token, greedy and
// sampled, comes from the constraint's mask (checked against a constraint that allows a scripted token per step,
// which the model would never pick on its own); the sequence ends with "stop" when the constraint is complete, with
// "length" at max_tokens before that; end tokens pass only where the constraint says the text may end.
// (Lives under tests/server/ beside scheduler_test: the server is the scheduler's only client.)
#include "runtime/engine/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <limits>

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

struct Collector : SequenceObserver {
  std::vector<int32_t> tokens;
  SequenceResult result;
  std::promise<void> done;
  bool on_token(const TokenOutput& t) override {
    tokens.push_back(t.token);
    return true;
  }
  void on_finish(const SequenceResult& r) override {
    result = r;
    done.set_value();
  }
};

SchedulerOptions options() {
  SchedulerOptions o;
  o.context = 256;
  o.max_batch = 4;
  o.threads = 1;
  o.pin_threads = false;
  return o;
}

SequenceResult run(Scheduler& s, std::shared_ptr<Scripted> constraint, float temperature, int64_t max_tokens,
                   std::vector<int32_t>& tokens, std::vector<int32_t> stops = {}) {
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
    const auto r = run(s, constraint, temperature, 50, tokens);
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
  const auto r = run(s, constraint, 0.0f, 2, tokens);
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
    const auto r = run(s, constraint, 0.0f, 10, tokens, stops);
    EXPECT_EQ(r.finish_reason, "stop");
    if (end_allowed) EXPECT_TRUE(tokens.empty()) << "an end token was allowed and is likelier than token 1500";
    else EXPECT_EQ(tokens, (std::vector<int32_t>{1500}));
  }
}

}  // namespace
}  // namespace tierlm::engine
