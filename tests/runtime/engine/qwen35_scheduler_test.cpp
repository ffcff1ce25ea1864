// The scheduler on a model with recurrent layers (Qwen3.5's Gated DeltaNet, fixture qwen3_5_moe): the state folds
// every position in and cannot be rewound, so the prefix cache reuses a slot only when the shared prefix covers all
// the positions the state holds (a follow-up turn repeating the whole conversation), and otherwise starts over with a
// cleared state; cancellation leaves a slot that the next request reuses correctly; batched sequences equal each
// alone. The oracle is a cold run on a fresh scheduler (itself checked against transformers in qwen35_forward_test).
#include <future>
#include <random>

#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"
#include "tests/runtime/engine/scheduler_fixture.h"

#include "runtime/engine/scheduler.h"
#include "runtime/model/model.h"

using namespace tierlm;
using tierlm::fixtures::fixture;
using namespace tierlm::fixtures::scheduler;

namespace {

struct Model {
  tiering::Ledger ledger;
  model::ModelWeights w;
  Model() {
    model::LoadOptions o;
    o.ledger = &ledger;
    o.packed_experts = "";
    w = model::load_model(fixture("qwen3_5_moe"), o);
  }
};

}  // namespace

TEST(Qwen35Scheduler, PrefixCacheReusesOnlyTheWholeRecurrentState) {
  Model m;
  engine::Scheduler s(m.w, m.ledger, slots(1));
  EXPECT_STREQ(s.stats().prefix_cache, "whole_state");  // what /health reports as kv.prefix_cache
  const auto first = random_tokens(30, 5);
  const auto first_run = generate(s, first, 8);
  EXPECT_EQ(first_run->result.cached_prompt_tokens, 0);
  ASSERT_EQ(first_run->tokens.size(), 8u);
  // The state folded in the prompt and 7 generated tokens (the 8th was sampled, never run): 37 positions.
  std::vector<int32_t> follow_up = first;
  follow_up.insert(follow_up.end(), first_run->tokens.begin(), first_run->tokens.end());
  follow_up.insert(follow_up.end(), {7, 8, 9});
  const auto follow_run = generate(s, follow_up, 6);
  EXPECT_EQ(follow_run->result.cached_prompt_tokens, 37);
  // A prompt sharing only part of what the state holds cannot reuse it: it starts over.
  std::vector<int32_t> partial(first.begin(), first.begin() + 20);
  partial.insert(partial.end(), {10, 11});
  const auto partial_run = generate(s, partial, 6);
  EXPECT_EQ(partial_run->result.cached_prompt_tokens, 0);
  for (auto [prompt, warm] : {std::pair{follow_up, follow_run}, std::pair{partial, partial_run}}) {
    engine::Scheduler fresh(m.w, m.ledger, slots(1));
    expect_same(*generate(fresh, prompt, 6), *warm, "warm vs cold");
  }
}

TEST(Qwen35Scheduler, CancelledSequenceLeavesAUsableSlot) {
  Model m;
  engine::Scheduler s(m.w, m.ledger, slots(1));
  auto cancelled = start(s, random_tokens(25, 7), 100, /*signal_after=*/3);
  cancelled->started.get_future().wait();
  cancelled->handle->cancel();  // mid-decode: its slot holds a state of some 28 positions
  cancelled->done.get_future().wait();
  EXPECT_EQ(cancelled->result.finish_reason, "cancelled");
  const auto next_prompt = random_tokens(18, 9);
  const auto next = generate(s, next_prompt, 8);
  EXPECT_EQ(next->result.finish_reason, "length");
  engine::Scheduler fresh(m.w, m.ledger, slots(1));
  expect_same(*generate(fresh, next_prompt, 8), *next, "after a cancellation");
}

TEST(Qwen35Scheduler, BatchedSequencesEqualEachAlone) {
  Model m;
  const auto a = random_tokens(21, 1), b = random_tokens(9, 2), c = random_tokens(15, 3);
  engine::Scheduler batched(m.w, m.ledger, slots(3));
  auto ra = start(batched, a, 10), rb = start(batched, b, 10), rc = start(batched, c, 10);
  for (auto* r : {&ra, &rb, &rc}) (*r)->done.get_future().wait();
  engine::Scheduler alone(m.w, m.ledger, slots(1));
  expect_same(*generate(alone, a, 10), *ra, "a");
  expect_same(*generate(alone, b, 10), *rb, "b");
  expect_same(*generate(alone, c, 10), *rc, "c");
  EXPECT_GT(batched.stats().batched_rows_total, batched.stats().steps_total) << "the sequences shared steps";
}
