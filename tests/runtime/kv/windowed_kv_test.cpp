// Sliding-window attention's state (runtime/engine/kv_cache.h, runtime/kv/state_spec.h). The transformers fixtures
// (forward_test: mistral-swa, qwen2-swa) fix the math over 56 positions; here the ring that bounds a windowed layer's
// KV is checked against the same cache unbounded (every position kept, the window applied by masking), far past the
// point where the ring wraps: chunked prefill across window and page boundaries, decode, batches and prefix reuse
// must give the same logits; the scheduler's prefix cache reuses a ring only while it holds the window. /health
// reports the bound at 32K context.
#include <algorithm>
#include <future>
#include <random>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/runtime/engine/reference_fixture.h"

#include "runtime/engine/forward.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/engine/scheduler.h"
#include "runtime/model/model.h"
#include "server/telemetry.h"

using namespace tierlm;
using tierlm::fixtures::fixture;

namespace {

engine::KVCacheOptions chunked(int64_t max_chunk) {
  engine::KVCacheOptions o;
  o.max_chunk = max_chunk;
  return o;
}

std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(3 + rng() % 250);
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

struct Model {
  tiering::Ledger ledger;
  model::ModelWeights w;
  explicit Model(const std::string& name) : w(load(name)) {}
  model::ModelWeights load(const std::string& name) {
    model::LoadOptions o;
    o.ledger = &ledger;
    return model::load_model(fixture(name), o);
  }
};

}  // namespace

// 300 positions, window 8: prefill 200 in chunks of 7 (crossing page and window boundaries at every offset), decode
// 100. The ring holds ceil((8 - 1 + 7) / 32) + 1 = 2 pages per windowed layer, so it wraps many times.
TEST(WindowedKv, RingEqualsUnboundedCacheFarPastTheWindow) {
  for (const std::string name : {"mistral-swa", "qwen2-swa"}) {
    Model m(name);
    const auto& c = m.w.config;
    const int64_t V = c.vocab_size, context = 320, chunk = 7;
    kernels::ThreadPool pool(2);
    engine::Forward forward(m.w, pool, m.ledger, 64, context);
    engine::KVCache unbounded(c, context, m.ledger), ring(c, context, m.ledger, chunked(chunk));
    EXPECT_LT(ring.bytes(), unbounded.bytes());
    EXPECT_EQ(ring.bytes(), engine::KVCache::bytes_for(c, context, chunked(chunk)));
    const auto prompt = tokens(200, 7);
    std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
    forward.run(std::span(prompt).subspan(0, 64), 0, unbounded, a.data());
    forward.run(std::span(prompt).subspan(64, 64), 64, unbounded, a.data());
    forward.run(std::span(prompt).subspan(128, 64), 128, unbounded, a.data());
    forward.run(std::span(prompt).subspan(192, 8), 192, unbounded, a.data());
    for (size_t i = 0; i < prompt.size(); i += chunk) {
      const size_t len = std::min<size_t>(chunk, prompt.size() - i);
      forward.run(std::span(prompt).subspan(i, len), int64_t(i), ring, b.data());
    }
    EXPECT_LT(max_abs_diff(a, b), 1e-4) << name << " after prefill";
    double worst = 0;
    for (int64_t pos = 200; pos < 300; ++pos) {
      const int32_t t = int32_t(fixtures::argmax(a.data(), V));
      forward.run(std::span(&t, 1), pos, unbounded, a.data());
      forward.run(std::span(&t, 1), pos, ring, b.data());
      worst = std::max(worst, max_abs_diff(a, b));
    }
    EXPECT_LT(worst, 1e-4) << name << " decode";
    // A chunk longer than the ring was sized for is refused, not silently wrong.
    const auto long_chunk = tokens(8, 9);
    EXPECT_THROW(forward.run(long_chunk, 300, ring, b.data()), std::invalid_argument);
  }
}

// The window really is applied: with window 8, the logits at position 40 do not depend on the token at position 10,
// and they do on the one at position 33 (the first position a query at 40 sees).
TEST(WindowedKv, OnlyTheLastWindowPositionsMatter) {
  Model m("mistral-swa");
  const int64_t V = m.w.config.vocab_size;
  kernels::ThreadPool pool(2);
  engine::Forward forward(m.w, pool, m.ledger, 64, 64);
  auto logits_at_40 = [&](std::vector<int32_t> t) {
    engine::KVCache cache(m.w.config, 64, m.ledger, chunked(64));
    std::vector<float> out(static_cast<size_t>(V));
    forward.run(std::span(t).subspan(0, 41), 0, cache, out.data());
    return out;
  };
  auto base = tokens(41, 3);
  auto far = base, near = base;
  // Two layers of window 8: position 40 sees 33..40 in layer 1, whose rows saw 26..40 in layer 0.
  far[10] = base[10] == 5 ? 6 : 5;
  near[33] = base[33] == 5 ? 6 : 5;
  EXPECT_LT(max_abs_diff(logits_at_40(base), logits_at_40(far)), 1e-6);
  EXPECT_GT(max_abs_diff(logits_at_40(base), logits_at_40(near)), 1e-3);
}

TEST(WindowedKv, BatchOfSequencesEqualsEachAlone) {
  Model m("qwen2-swa");
  const auto& c = m.w.config;
  const int64_t V = c.vocab_size;
  kernels::ThreadPool pool(2);
  engine::Forward f(m.w, pool, m.ledger, 32, 128);
  const auto a = tokens(40, 1), b = tokens(25, 2);
  engine::KVCache ca(c, 128, m.ledger, chunked(16)), cb(c, 128, m.ledger, chunked(16));
  engine::KVCache xa(c, 128, m.ledger, chunked(16)), xb(c, 128, m.ledger, chunked(16));
  std::vector<float> la(static_cast<size_t>(V)), lb(la), ya(la), yb(la);
  // Alone, then together, 16 positions per sequence per step (the batch holds 32 rows).
  for (size_t i = 0; i < a.size(); i += 16) f.run(std::span(a).subspan(i, std::min<size_t>(16, a.size() - i)), int64_t(i), ca, la.data());
  for (size_t i = 0; i < b.size(); i += 16) f.run(std::span(b).subspan(i, std::min<size_t>(16, b.size() - i)), int64_t(i), cb, lb.data());
  for (size_t i = 0; i < a.size(); i += 16) {
    std::vector<engine::BatchItem> items;
    items.push_back({std::span(a).subspan(i, std::min<size_t>(16, a.size() - i)), int64_t(i), &xa, ya.data()});
    if (i < b.size()) items.push_back({std::span(b).subspan(i, std::min<size_t>(16, b.size() - i)), int64_t(i), &xb, yb.data()});
    f.run_batch(items);
  }
  EXPECT_LT(max_abs_diff(la, ya), 1e-4);
  EXPECT_LT(max_abs_diff(lb, yb), 1e-4);
  // Decode together for 60 steps (past the ring's wrap).
  for (int64_t s = 0; s < 60; ++s) {
    const int32_t ta = int32_t(fixtures::argmax(la.data(), V)), tb = int32_t(fixtures::argmax(lb.data(), V));
    f.run(std::span(&ta, 1), 40 + s, ca, la.data());
    f.run(std::span(&tb, 1), 25 + s, cb, lb.data());
    std::vector<engine::BatchItem> items = {{std::span(&ta, 1), 40 + s, &xa, ya.data()},
                                            {std::span(&tb, 1), 25 + s, &xb, yb.data()}};
    f.run_batch(items);
    ASSERT_LT(max_abs_diff(la, ya), 1e-4) << s;
    ASSERT_LT(max_abs_diff(lb, yb), 1e-4) << s;
  }
}

// Prefix reuse on a ring: allowed while the ring still holds the window that ends at the prefix.
TEST(WindowedKv, RingHoldsAPrefixOnlyWhileItsWindowIsThere) {
  Model m("mistral-swa");
  engine::KVCache ring(m.w.config, 512, m.ledger, chunked(16));  // window 8: ceil(23/32)+1 = 2 pages
  EXPECT_TRUE(ring.holds_prefix(0));
  ring.will_write(40);  // pages 0, 1 written
  EXPECT_TRUE(ring.holds_prefix(40));
  EXPECT_TRUE(ring.holds_prefix(20));
  ring.will_write(100);  // pages up to 3: the ring holds pages 2, 3 (positions 64..127)
  EXPECT_TRUE(ring.holds_prefix(100));
  EXPECT_TRUE(ring.holds_prefix(71));   // needs 64..70
  EXPECT_FALSE(ring.holds_prefix(70));  // needs 63..69: page 1 is gone
  engine::KVCache full(m.w.config, 512, m.ledger);  // unbounded: every prefix stays
  full.will_write(500);
  EXPECT_TRUE(full.holds_prefix(3));
}

// /health at 32K context: the windowed layers' KV is their rings, the same at 4K and 32K; only the full-attention
// layer grows. qwen2-swa: layer 0 full, layers 1-2 windowed (window 8).
TEST(WindowedKv, HealthReportsBoundedWindowedBytesAtLongContext) {
  Model m("qwen2-swa");
  auto health_kv = [&](int64_t context) {
    engine::SchedulerOptions o;
    o.context = context;
    o.max_batch = 1;
    o.threads = 1;
    o.pin_threads = false;
    o.prefill_size = 64;
    engine::Scheduler scheduler(m.w, m.ledger, o);
    server::Telemetry telemetry(server::ServerInfo{}, m.ledger, scheduler);
    return telemetry.health().at("kv").as_object();
  };
  const auto k4 = health_kv(4096), k32 = health_kv(32768);
  const auto& c = m.w.config;
  const auto layout = kv::layout_for(kv::default_codec(), int(c.head_dim));
  const uint64_t ring = c.state_spec(1).bytes(layout, 32768, 64);  // ceil((8 - 1 + 64) / 32) + 1 = 4 pages
  EXPECT_EQ(ring, 4 * c.state_spec(1).page_bytes(layout));
  EXPECT_EQ(k32.at("windowed_bytes").as_uint64(), 2 * ring);
  EXPECT_EQ(k4.at("windowed_bytes").as_uint64(), k32.at("windowed_bytes").as_uint64());
  const uint64_t full_layer = c.state_spec(0).bytes(layout, 32768, 64);
  EXPECT_EQ(k32.at("bytes").as_uint64(), full_layer + 2 * ring);
  EXPECT_EQ(k32.at("bytes_without_windows").as_uint64(), 3 * full_layer);
  std::printf("qwen2-swa KV at 32K context: %llu bytes (windowed layers %llu), %llu without windows\n",
              (unsigned long long)k32.at("bytes").as_uint64(), (unsigned long long)k32.at("windowed_bytes").as_uint64(),
              (unsigned long long)k32.at("bytes_without_windows").as_uint64());
}

namespace {

struct Collect : engine::SequenceObserver {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each chosen token: a stale window shows here before it flips a greedy choice
  engine::SequenceResult result;
  std::promise<void> done;
  bool on_token(const engine::TokenOutput& t) override {
    tokens.push_back(t.token);
    logprobs.push_back(t.logprob);
    return true;
  }
  void on_finish(const engine::SequenceResult& r) override {
    result = r;
    done.set_value();
  }
};

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t cached = 0;
};

Generated generate(engine::Scheduler& s, std::vector<int32_t> prompt, int64_t n) {
  engine::SequenceParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = n;
  auto c = std::make_shared<Collect>();
  auto f = c->done.get_future();
  s.submit(std::move(p), c);
  f.wait();
  return {c->tokens, c->logprobs, c->result.cached_prompt_tokens};
}

engine::SchedulerOptions one_slot() {
  engine::SchedulerOptions o;
  o.context = 256;
  o.max_batch = 1;  // every request reuses the one slot's ring
  o.prefill_size = 16;
  o.threads = 1;
  o.pin_threads = false;
  return o;
}

}  // namespace

// The scheduler's prefix cache on a windowed model: a prefix is reused when the ring still holds the window ending at
// it, else the prompt runs cold; either way the output equals a cold run's.
TEST(WindowedKv, PrefixCacheOnARingEqualsAColdRun) {
  Model m("mistral-swa");
  const auto first = tokens(120, 11);
  engine::Scheduler s(m.w, m.ledger, one_slot());
  const Generated first_run = generate(s, first, 10);
  EXPECT_EQ(first_run.cached, 0);
  std::vector<int32_t> history = first;
  history.insert(history.end(), first_run.tokens.begin(), first_run.tokens.end());  // positions 0..128 written
  // The ring (2 pages of 32: window 8 + chunk 16) holds positions 96..159: the window ending at 125 is there.
  std::vector<int32_t> near(history.begin(), history.begin() + 125);
  near.insert(near.end(), {7, 8, 9});
  const Generated near_run = generate(s, near, 8);
  EXPECT_EQ(near_run.cached, 125);
  // The window ending at 70 (positions 63..69) left the ring (its slots now hold positions 127..133): no reuse.
  std::vector<int32_t> far(history.begin(), history.begin() + 70);
  far.insert(far.end(), {10, 11});
  const Generated far_run = generate(s, far, 8);
  EXPECT_EQ(far_run.cached, 0);
  for (auto [prompt, warm] : {std::pair{near, near_run}, std::pair{far, far_run}}) {
    engine::Scheduler fresh(m.w, m.ledger, one_slot());
    const Generated cold = generate(fresh, prompt, 8);
    EXPECT_EQ(cold.tokens, warm.tokens);
    for (size_t i = 0; i < cold.logprobs.size() && i < warm.logprobs.size(); ++i)
      EXPECT_NEAR(cold.logprobs[i], warm.logprobs[i], 1e-4) << "token " << i;
  }
}

// The fixture discriminates: the same weights with the window ignored (what tierlm computed before sliding_window was
// read) are far from transformers' logits past the window.
TEST(WindowedKv, IgnoringTheWindowMissesTransformers) {
  Model m("mistral-swa");
  for (auto& l : m.w.config.layers) {
    l.mixer = model::Mixer::attention;
    l.window = 0;
  }
  const auto ref = fixtures::read_json(fixture("mistral-swa") / "reference.json").as_object();
  std::vector<int32_t> prompt;
  for (auto& t : ref.at("prompt").as_array()) prompt.push_back(int32_t(t.as_int64()));
  const int64_t V = m.w.config.vocab_size, n = int64_t(prompt.size());
  kernels::ThreadPool pool(2);
  engine::Forward forward(m.w, pool, m.ledger, 64, 64);
  engine::KVCache cache(m.w.config, 64, m.ledger);
  std::vector<float> logits(static_cast<size_t>(n * V));
  forward.run(prompt, 0, cache, logits.data(), true);
  const auto& expected = ref.at("prompt_logits").as_array();
  EXPECT_LT(fixtures::relative_error(&logits[0], fixtures::floats(expected[0])), 1e-3);  // inside the window: same
  EXPECT_GT(fixtures::relative_error(&logits[size_t((n - 1) * V)], fixtures::floats(expected[size_t(n - 1)])), 1e-2);
}
