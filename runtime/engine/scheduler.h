// runtime/engine/scheduler.h — serves many sequences on one engine thread: continuous batching of decode steps
// (every active sequence advances one token per step, in one Forward::run_batch), chunked prefill (prompts are fed
// at most prefill_size tokens per step, interleaved with the decodes), a prefix cache (a finished sequence's KV
// rows stay in its slot and a new prompt that shares their prefix starts after them) and cancellation.
// Owns: the engine thread, the compute thread pool (created on that thread so only it is pinned), Forward, one KV
// cache per slot (max_batch slots, allocated once through the ledger), the waiting queue. With GPU layers
// (SchedulerOptions::gpu) the engine thread is the only one that touches them once started; each slot's KVCache is
// the key of its device KV, and the prefix cache never reuses more positions than the device still holds.
// Never: calls observers while holding its lock, blocks the caller of submit() on compute, or lets one sequence's
// failure stop the others.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/sampler.h"
#include "runtime/engine/token_constraint.h"
#include "runtime/model/model.h"
#include "tiering/ledger.h"

namespace tierlm::gpu {
class GpuLayers;
}

namespace tierlm::engine {

struct SchedulerOptions {
  int64_t context = 0;        // positions per sequence (0: the model's max_position_embeddings)
  int64_t max_batch = 8;      // sequences decoded together (= KV slots)
  int64_t prefill_size = 256; // prompt tokens fed per step, across all prefilling sequences
  int64_t queue_limit = 64;   // sequences waiting for a slot before submit() refuses
  int threads = 0;            // compute threads (0: one per physical core)
  bool pin_threads = true;
  // Called on the engine thread once at start, after every step and before going idle: the place to copy counters
  // of state the engine thread owns (the expert tier's and the GPU layers' telemetry) for other threads to read.
  std::function<void()> after_step;
  // Layers [0, gpu->layers()) (and the head, when gpu->runs_head()) run on the GPU; null: CPU only. Build it with
  // max_chunk = Scheduler::step_rows(options), max_context >= the context, and max_sequences >= max_batch (one device
  // KV set per slot: a step of max_batch sequences must fit, and no idle slot's prefix is dropped).
  std::shared_ptr<gpu::GpuLayers> gpu;
};

struct SequenceParams {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // sampling one of these finishes with "stop"; it is not reported
  int top_logprobs = -1;             // -1: no logprobs; 0..20: the chosen token's logprob and this many best
  // Past it the sequence finishes at the next step: "length" when it has generated tokens, "timeout" when it has
  // none yet (still queued or prefilling). max(): no deadline.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Structured output: every token is sampled (greedy too) from the logits this constraint masks, and the sequence
  // finishes with "stop" once the constraint is complete. null: unconstrained.
  std::shared_ptr<TokenConstraint> constraint;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct TokenOutput {
  int32_t token = 0;
  float logprob = 0;                  // of the raw model distribution (before temperature and penalties)
  std::vector<TokenLogprob> top;      // best first; empty unless top_logprobs > 0
};

struct SequenceResult {
  std::string finish_reason;          // "stop" | "length" | "timeout" | "cancelled" | "error"
  std::string error;                  // set when finish_reason == "error"
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;   // prompt positions reused from the prefix cache
  int64_t completion_tokens = 0;
  double queue_seconds = 0;           // submit -> first forward
  double first_token_seconds = 0;     // submit -> first token
};

// Receives a sequence's tokens on the engine thread: keep it short (hand work to another thread).
class SequenceObserver {
 public:
  virtual ~SequenceObserver() = default;
  // false: stop now, finishing with "stop" (a stop string matched, the client needs no more).
  virtual bool on_token(const TokenOutput& token) = 0;
  // Called exactly once, after the last on_token.
  virtual void on_finish(const SequenceResult& result) = 0;
};

// Lets the submitter cancel from any thread; the sequence finishes with "cancelled" at the next step.
class SequenceHandle {
 public:
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> cancelled_{false};
};

class QueueFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SchedulerStats {
  int64_t active = 0;                 // sequences holding a slot
  int64_t waiting = 0;                // sequences queued for a slot (cancelled ones no longer count)
  int64_t slots = 0;
  int64_t context = 0;
  int64_t kv_positions_used = 0;      // positions filled by active sequences
  int64_t kv_positions_cached = 0;    // positions kept by idle slots for prefix reuse
  uint64_t kv_bytes = 0;              // allocated for all slots
  uint64_t kv_windowed_bytes = 0;     // the part of kv_bytes held by sliding-window layers (bounded rings)
  uint64_t kv_bytes_without_windows = 0;  // what kv_bytes would be if windowed layers kept the whole context
  uint64_t prompt_tokens_total = 0;   // prompt tokens of admitted sequences
  uint64_t prefilled_tokens_total = 0;// prompt tokens actually run through the model
  uint64_t cached_tokens_total = 0;   // prompt tokens served from the prefix cache
  // How the prefix cache can reuse a slot: "any_prefix" (attention only: any common prefix of the KV rows), or
  // "whole_state" (a recurrent layer's state cannot be cut back: reuse only when the new prompt repeats every
  // position the state absorbed, e.g. a follow-up turn; otherwise the prompt runs cold).
  const char* prefix_cache = "any_prefix";
  uint64_t generated_tokens_total = 0;
  uint64_t sequences_finished = 0;
  uint64_t sequences_cancelled = 0;
  uint64_t sequences_timed_out = 0;   // finished by their deadline ("length" or "timeout")
  int threads = 0;                    // compute threads in use (threads = 0 resolved to the core count)
  uint64_t steps_total = 0;
  uint64_t batched_rows_total = 0;    // sequences summed over steps (rows / steps = mean batch)
  double busy_seconds = 0;            // time spent in forward + sampling
};

class Scheduler {
 public:
  // Starts the engine thread; throws if the caches or scratch do not fit the ledger's budget.
  Scheduler(const model::ModelWeights& weights, tiering::Ledger& ledger, const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence. Throws std::invalid_argument for an empty prompt or one that leaves no room to generate,
  // QueueFullError when queue_limit sequences already wait (cancelled ones do not count: a client that hung up
  // gives its place back at once). The observer is kept until on_finish.
  std::shared_ptr<SequenceHandle> submit(SequenceParams params, std::shared_ptr<SequenceObserver> observer);

  // Token rows one step may run (prefill_size prompt tokens plus one per decoding sequence): the max_chunk that
  // Forward, and GpuLayers when given, are built for.
  static int64_t step_rows(const SchedulerOptions& options) { return options.prefill_size + options.max_batch; }

  SchedulerStats stats() const;
  int64_t context() const { return context_; }
  const SchedulerOptions& options() const { return options_; }
  // Stops the engine thread; sequences still queued or running finish with "cancelled".
  void stop();

 private:
  struct Sequence;
  struct Slot;
  void engine_main(std::promise<void>* ready);
  void run_loop();
  void admit_locked();
  void update_kv_stats_locked();
  int64_t waiting_count_locked() const;
  bool step();
  void emit(Sequence& seq, Slot& slot, const float* logits, const int32_t* greedy = nullptr);
  static int32_t* greedy_target(Sequence& seq);
  int32_t sample_constrained(Sequence& seq, const float* logits);
  void finish(Sequence& seq, const std::string& reason, const std::string& error = {});

  const model::ModelWeights& weights_;
  tiering::Ledger& ledger_;
  SchedulerOptions options_;
  int64_t context_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  SchedulerStats stats_;              // guarded by mutex_

  // Engine-thread state.
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Sequence>> active_;
  uint64_t clock_ = 0;                // LRU clock for idle slots
  std::string startup_error_;
  std::thread thread_;
  struct EngineState;
  std::unique_ptr<EngineState> engine_;
};

}  // namespace tierlm::engine
