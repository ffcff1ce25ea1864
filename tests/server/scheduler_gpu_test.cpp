// Scheduler with GPU layers (SchedulerOptions::gpu) on tierlm-tiny: the prefix cache reuses a slot's rows on the GPU
// too, and never reuses positions the device no longer holds; the GPU telemetry copy (server/gpu_layers_counters.h)
// is filled on the engine thread. Skips without a GPU (the reason is printed); the clamp itself is also covered
// without one by tests/runtime/engine/prefix_reuse_test.cpp.
#include "runtime/engine/scheduler.h"

#include <gtest/gtest.h>

#include <future>

#include "runtime/gpu/gpu_layers.h"
#include "runtime/gpu/gpu_probe.h"
#include "server/gpu_layers_counters.h"
#include "tests/runtime/gpu/skip_without_gpu.h"

namespace tierlm::engine {
namespace {

std::string model_dir() { return std::string(TIERLM_SOURCE_DIR) + "/profiles/models/tierlm-tiny"; }

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

std::shared_ptr<Collector> run_alone(Scheduler& s, std::vector<int32_t> prompt) {
  auto c = std::make_shared<Collector>();
  SequenceParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = 8;
  auto f = c->done.get_future();
  s.submit(std::move(p), c);
  f.wait();
  return c;
}

// The default model as stored, charged to `ledger`.
model::ModelWeights load_weights(tiering::Ledger& ledger) {
  model::LoadOptions load;
  load.ledger = &ledger;
  return model::load_model(model_dir(), load);
}

SchedulerOptions options(int64_t max_batch) {
  SchedulerOptions o;
  o.context = 256;
  o.max_batch = max_batch;
  o.prefill_size = 64;
  o.threads = 1;
  o.pin_threads = false;
  return o;
}

std::shared_ptr<gpu::GpuLayers> gpu_layers(const model::ModelWeights& w, const SchedulerOptions& o, int64_t layers,
                                           int64_t max_sequences) {
  gpu::GpuOptions g;
  g.layers = layers;
  g.max_sequences = max_sequences;
  return std::make_shared<gpu::GpuLayers>(w, g, Scheduler::step_rows(o), o.context);
}

// Token ids with no common first token, so the second prompt never prefers the first one's slot.
const std::vector<int32_t> kFirst = {11, 301, 502, 77, 1024, 9, 640, 33, 1500, 2};
const std::vector<int32_t> kSecond = {12, 400, 13, 815, 99, 1201, 7, 45};

TEST(SchedulerGpu, PrefixReuseOnTheGpuKeepsOutput) {
  SKIP_WITHOUT_GPU();
  tiering::Ledger ledger;
  const model::ModelWeights weights = load_weights(ledger);
  SchedulerOptions o = options(2);
  o.gpu = gpu_layers(weights, o, weights.config.num_layers, o.max_batch);  // every layer and the head
  auto counters = std::make_shared<server::GpuLayersCounters>(o.gpu, weights.config.num_layers);
  o.after_step = [counters] { counters->refresh(); };
  Scheduler s(weights, ledger, o);
  const auto fresh = run_alone(s, kFirst);
  ASSERT_EQ(fresh->result.finish_reason, "length") << fresh->result.error;
  const auto again = run_alone(s, kFirst);
  ASSERT_EQ(again->result.finish_reason, "length") << again->result.error;
  EXPECT_EQ(again->result.cached_prompt_tokens, int64_t(kFirst.size()) - 1);
  EXPECT_EQ(again->tokens, fresh->tokens);
  // The telemetry copy, made on the engine thread after the last step: the VRAM ledger by account, which adds up.
  const server::GpuCounters g = counters->gpu_counters();
  EXPECT_EQ(g.layers, weights.config.num_layers);
  EXPECT_TRUE(g.output_head);
  EXPECT_GT(g.weight_bytes, 0u);
  EXPECT_GE(g.vram_used, g.weight_bytes);
  EXPECT_GE(g.vram_peak, g.vram_used);
  uint64_t sum = 0;
  for (const auto& a : g.vram_accounts) sum += a.bytes;
  EXPECT_EQ(sum, g.vram_used);
}

// The device keeps one sequence's KV (max_sequences 1): running the second prompt in the other slot drops the first
// slot's device KV, so the first prompt again must be recomputed from position 0 rather than reuse the host's rows
// (GpuLayers::run refuses a step that starts past what the device holds: "error" without the clamp).
TEST(SchedulerGpu, DroppedDeviceKvIsNotReused) {
  SKIP_WITHOUT_GPU();
  tiering::Ledger ledger;
  const model::ModelWeights weights = load_weights(ledger);
  SchedulerOptions o = options(2);
  o.gpu = gpu_layers(weights, o, 2, /*max_sequences=*/1);  // layers 0-1 on the GPU, the rest on the CPU
  Scheduler s(weights, ledger, o);
  const auto first = run_alone(s, kFirst);
  ASSERT_EQ(first->result.finish_reason, "length") << first->result.error;
  const auto second = run_alone(s, kSecond);
  ASSERT_EQ(second->result.finish_reason, "length") << second->result.error;
  EXPECT_EQ(second->result.cached_prompt_tokens, 0);
  const auto again = run_alone(s, kFirst);
  ASSERT_EQ(again->result.finish_reason, "length") << again->result.error;
  EXPECT_EQ(again->result.cached_prompt_tokens, 0);
  EXPECT_EQ(again->tokens, first->tokens);
}

}  // namespace
}  // namespace tierlm::engine
