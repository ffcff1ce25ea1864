#include "runtime/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/engine/forward.h"
#include "runtime/engine/kv_cache.h"
#include "runtime/engine/prefix_reuse.h"
#include "runtime/gpu/gpu_layers.h"
#include "runtime/kernels/thread_pool.h"

namespace tierlm::engine {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// log-softmax of the raw logits at `token`, and the `top` best tokens with theirs.
void fill_logprobs(const float* logits, int64_t vocab, int top, TokenOutput& out) {
  float max_logit = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i] - max_logit));
  const double log_z = double(max_logit) + std::log(sum);
  out.logprob = float(double(logits[out.token]) - log_z);
  if (top <= 0) return;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[size_t(i)] = int32_t(i);
  const int64_t k = std::min<int64_t>(top, vocab);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  out.top.clear();
  for (int64_t i = 0; i < k; ++i)
    out.top.push_back({order[size_t(i)], float(double(logits[order[size_t(i)]]) - log_z)});
}
}  // namespace

// A KV cache and what its filled positions hold; idle slots keep their rows for prefix reuse.
struct Scheduler::Slot {
  KVCache cache;
  std::vector<int32_t> tokens;  // tokens whose keys/values are in cache positions [0, tokens.size())
  uint64_t last_used = 0;
  bool busy = false;
  // A step feeds a slot at most prefill_size tokens, which bounds the rings of windowed layers.
  // first_layer: the GPU layers, whose KV and states the device keeps (the cache holds none for them).
  Slot(const model::ModelConfig& config, int64_t capacity, int64_t max_chunk, int64_t first_layer,
       tiering::Ledger& ledger)
      : cache(config, capacity, ledger, [&] {
          KVCacheOptions o;
          o.max_chunk = max_chunk;
          o.first_layer = first_layer;
          return o;
        }()) {}
};

struct Scheduler::Sequence {
  SequenceParams params;
  std::shared_ptr<SequenceObserver> observer;
  std::shared_ptr<SequenceHandle> handle;
  std::optional<Sampler> sampler;
  Slot* slot = nullptr;
  std::vector<int32_t> generated;
  std::vector<float> logits;
  std::vector<float> masked_logits;  // the constraint's copy of logits
  int32_t next_token = -1;      // sampled, not yet fed (decode phase)
  int32_t greedy_token = -1;    // the step's argmax, when the sequence decodes greedily (Forward fills it)
  bool decoding = false;
  bool done = false;
  int64_t cached = 0;
  Clock::time_point submitted;
  std::optional<Clock::time_point> started, first_token;
};

struct Scheduler::EngineState {
  kernels::ThreadPool pool;
  Forward forward;
  EngineState(const model::ModelWeights& w, tiering::Ledger& ledger, const SchedulerOptions& o, int64_t context)
      : pool(o.threads, o.pin_threads), forward(w, pool, ledger, Scheduler::step_rows(o), context) {
    if (o.gpu) forward.use_gpu(o.gpu);
  }
};

Scheduler::Scheduler(const model::ModelWeights& weights, tiering::Ledger& ledger, const SchedulerOptions& options)
    : weights_(weights), ledger_(ledger), options_(options) {
  context_ = options.context > 0 ? options.context : weights.config.max_position_embeddings;
  if (context_ <= 1) throw std::invalid_argument("scheduler: context must hold at least 2 positions");
  if (options.max_batch <= 0) throw std::invalid_argument("scheduler: max_batch must be positive");
  if (options.prefill_size <= 0) throw std::invalid_argument("scheduler: prefill_size must be positive");
  if (options.queue_limit < 0) throw std::invalid_argument("scheduler: queue_limit must be >= 0");
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = std::thread([this, &ready] { engine_main(&ready); });
  try {
    started.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::engine_main(std::promise<void>* ready) {
  try {
    engine_ = std::make_unique<EngineState>(weights_, ledger_, options_, context_);
    const int64_t gpu_layers = options_.gpu ? options_.gpu->layers() : 0;
    for (int64_t i = 0; i < options_.max_batch; ++i)
      slots_.push_back(std::make_unique<Slot>(weights_.config, context_, options_.prefill_size, gpu_layers, ledger_));
    {
      std::lock_guard lock(mutex_);
      stats_.slots = options_.max_batch;
      stats_.context = context_;
      stats_.kv_bytes = slots_.empty() ? 0 : slots_.size() * slots_[0]->cache.bytes();
      stats_.kv_windowed_bytes = slots_.empty() ? 0 : slots_.size() * slots_[0]->cache.windowed_bytes();
      KVCacheOptions kv_options;
      kv_options.max_chunk = options_.prefill_size;
      kv_options.first_layer = gpu_layers;
      stats_.kv_bytes_without_windows =
          slots_.size() * KVCache::bytes_without_windows(weights_.config, context_, kv_options);
      stats_.threads = engine_->pool.size();
      stats_.prefix_cache = weights_.config.any_recurrent() ? "whole_state" : "any_prefix";
    }
  } catch (...) {
    slots_.clear();
    engine_.reset();
    ready->set_exception(std::current_exception());
    return;
  }
  if (options_.after_step) options_.after_step();
  ready->set_value();
  run_loop();
  // Leaving: every sequence still known finishes as cancelled.
  for (auto& seq : active_) finish(*seq, "cancelled");
  active_.clear();
  std::deque<std::unique_ptr<Sequence>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(waiting_);
  }
  for (auto& seq : left) finish(*seq, "cancelled");
  // The slots' device KV goes with them (a later scheduler on the same GPU layers may reuse their addresses as keys).
  if (options_.gpu)
    for (auto& slot : slots_) options_.gpu->forget(&slot->cache);
  slots_.clear();
  engine_.reset();  // the pool is destroyed on the thread that created it
}

std::shared_ptr<SequenceHandle> Scheduler::submit(SequenceParams params, std::shared_ptr<SequenceObserver> observer) {
  if (params.prompt.empty()) throw std::invalid_argument("the prompt is empty (no tokens to condition on)");
  if (int64_t(params.prompt.size()) >= context_)
    throw std::invalid_argument(fmt::format("the prompt has {} tokens but the context holds {} (one more is needed "
                                            "to generate)", params.prompt.size(), context_));
  if (params.max_tokens < 1) throw std::invalid_argument("max_tokens must be at least 1");
  const int32_t vocab = int32_t(weights_.config.vocab_size);
  for (int32_t t : params.prompt)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument(fmt::format("token id {} is outside the vocabulary (size {})", t, vocab));
  if (params.top_logprobs > 20) throw std::invalid_argument("top_logprobs must be at most 20");
  auto seq = std::make_unique<Sequence>();
  seq->sampler.emplace(params.sampling);  // validates the sampling parameters
  seq->params = std::move(params);
  seq->observer = std::move(observer);
  seq->handle = std::make_shared<SequenceHandle>();
  seq->submitted = Clock::now();
  auto handle = seq->handle;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw QueueFullError("the server is shutting down");
    // Cancelled entries leave the queue at the engine's next step; until then they hold no place.
    const int64_t waiting = waiting_count_locked();
    if (waiting >= options_.queue_limit)
      throw QueueFullError(fmt::format("{} requests are already waiting (queue limit {})", waiting,
                                       options_.queue_limit));
    waiting_.push_back(std::move(seq));
    stats_.waiting = waiting + 1;
  }
  wake_.notify_one();
  return handle;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  SchedulerStats s = stats_;
  s.waiting = waiting_count_locked();
  return s;
}

int64_t Scheduler::waiting_count_locked() const {
  return int64_t(std::count_if(waiting_.begin(), waiting_.end(),
                               [](const auto& seq) { return !seq->handle->cancelled(); }));
}

// Moves waiting sequences into free slots, preferring the idle slot whose cached tokens share the longest prefix
// with the prompt (those positions are not recomputed), then the least recently used one. With GPU layers, a slot's
// reusable prefix is also bounded by the positions the device still holds for it (engine thread: may ask the GPU).
void Scheduler::admit_locked() {
  // Cancelled and expired sequences leave from anywhere in the queue (not only its head, which may wait for a slot
  // a long time); they finish at the next step, outside the lock.
  const auto now = Clock::now();
  for (auto& seq : waiting_)
    if (seq->handle->cancelled() || seq->params.deadline <= now) active_.push_back(std::move(seq));
  std::erase_if(waiting_, [](const auto& seq) { return !seq; });
  while (!waiting_.empty()) {
    auto& seq = waiting_.front();
    Slot* best = nullptr;
    int64_t best_reuse = -1;
    const auto& prompt = seq->params.prompt;
    for (auto& slot : slots_) {
      if (slot->busy) continue;
      const std::optional<int64_t> on_device =
          options_.gpu ? std::optional<int64_t>(options_.gpu->cached_positions(&slot->cache)) : std::nullopt;
      int64_t reuse = reusable_prefix(slot->tokens, prompt, on_device);
      // A windowed layer's ring may have moved past the window that ends at the shared prefix: then start over.
      // A recurrent state (Gated DeltaNet) cannot be rewound: it holds exactly the slot's tokens, so only a prompt
      // that repeats all of them (a follow-up turn) reuses it; otherwise the sequence starts over at position 0,
      // where the mixer clears the state.
      if (!slot->cache.holds_prefix(reuse)) reuse = 0;
      if (reuse > best_reuse || (reuse == best_reuse && slot->last_used < best->last_used)) {
        best = slot.get();
        best_reuse = reuse;
      }
    }
    if (!best) return;  // every slot busy
    best->busy = true;
    best->last_used = ++clock_;
    best->tokens.resize(size_t(best_reuse));
    seq->slot = best;
    seq->cached = best_reuse;
    stats_.prompt_tokens_total += prompt.size();
    stats_.cached_tokens_total += uint64_t(best_reuse);
    active_.push_back(std::move(seq));
    waiting_.pop_front();
  }
}

void Scheduler::run_loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !active_.empty() || !waiting_.empty(); });
      if (stopping_) return;
      admit_locked();
      stats_.waiting = int64_t(waiting_.size());
    }
    if (!step()) {
      // Waiting sequences but no free slot and nothing runnable cannot happen (slots free on finish); guard anyway.
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
}

// One forward pass: every decoding sequence contributes its next token, then prefilling sequences take up to
// prefill_size prompt tokens between them (in admission order). Returns false when nothing ran.
bool Scheduler::step() {
  // Cancelled and expired sequences leave first, freeing their slots for the next admission.
  const auto now = Clock::now();
  for (auto& seq : active_) {
    if (seq->handle->cancelled()) {
      finish(*seq, "cancelled");
    } else if (seq->params.deadline <= now) {
      {
        std::lock_guard lock(mutex_);
        stats_.sequences_timed_out += 1;
      }
      finish(*seq, seq->generated.empty() ? "timeout" : "length");
    }
  }
  std::erase_if(active_, [](const auto& s) { return s->done; });
  if (active_.empty()) {
    if (options_.after_step) options_.after_step();
    std::lock_guard lock(mutex_);
    stats_.active = 0;
    update_kv_stats_locked();  // the last sequences may have just left: their positions are now only cached
    return false;
  }

  const auto t0 = Clock::now();
  std::vector<BatchItem> items;
  std::vector<Sequence*> owners;
  std::vector<int64_t> fed;
  const int64_t vocab = weights_.config.vocab_size;
  for (auto& seq : active_) {
    if (!seq->decoding) continue;
    if (seq->logits.empty()) seq->logits.resize(size_t(vocab));
    items.push_back({std::span(&seq->next_token, 1), int64_t(seq->slot->tokens.size()), &seq->slot->cache,
                     seq->logits.data(), false, greedy_target(*seq)});
    owners.push_back(seq.get());
    fed.push_back(1);
  }
  int64_t budget = options_.prefill_size;
  for (auto& seq : active_) {
    if (seq->decoding || budget <= 0) continue;
    const auto& prompt = seq->params.prompt;
    const int64_t done = int64_t(seq->slot->tokens.size());
    const int64_t len = std::min<int64_t>(budget, int64_t(prompt.size()) - done);
    if (len <= 0) continue;
    if (seq->logits.empty()) seq->logits.resize(size_t(vocab));
    if (!seq->started) seq->started = t0;
    items.push_back({std::span(prompt).subspan(size_t(done), size_t(len)), done, &seq->slot->cache,
                     seq->logits.data(), false, greedy_target(*seq)});
    owners.push_back(seq.get());
    fed.push_back(len);
    budget -= len;
  }
  if (items.empty()) return false;

  try {
    engine_->forward.run_batch(items);
  } catch (const std::exception& e) {
    // Forward validates before writing any cache, so the others are intact; fail only this step's sequences.
    spdlog::error("[scheduler] forward failed: {}", e.what());
    if (options_.after_step) options_.after_step();  // the failure's counters (e.g. expert read errors) go out first
    for (Sequence* seq : owners) {
      seq->slot->tokens.clear();
      finish(*seq, "error", e.what());
    }
    std::erase_if(active_, [](const auto& s) { return s->done; });
    return true;
  }

  if (options_.after_step) options_.after_step();  // before the tokens go out: counters already include this step
  uint64_t prefilled = 0;
  for (size_t i = 0; i < owners.size(); ++i) {
    Sequence& seq = *owners[i];
    auto& tokens = seq.slot->tokens;
    if (seq.decoding) {
      tokens.push_back(seq.next_token);
    } else {
      const auto chunk = items[i].tokens;
      tokens.insert(tokens.end(), chunk.begin(), chunk.end());
      prefilled += chunk.size();
      if (tokens.size() < seq.params.prompt.size()) continue;  // more prompt to feed next step
    }
    emit(seq, *seq.slot, seq.logits.data(), items[i].greedy);
  }
  std::erase_if(active_, [](const auto& s) { return s->done; });

  const double busy = seconds_between(t0, Clock::now());
  std::lock_guard lock(mutex_);
  stats_.steps_total += 1;
  stats_.batched_rows_total += owners.size();
  stats_.prefilled_tokens_total += prefilled;
  stats_.busy_seconds += busy;
  stats_.active = int64_t(active_.size());
  update_kv_stats_locked();
  return true;
}

// Engine thread (it owns the slots), with mutex_ held.
void Scheduler::update_kv_stats_locked() {
  int64_t used = 0, cached = 0;
  for (auto& slot : slots_) (slot->busy ? used : cached) += int64_t(slot->tokens.size());
  stats_.kv_positions_used = used;
  stats_.kv_positions_cached = cached;
}

// Where Forward should put the sequence's greedy token: only when the sampler would take the plain argmax of the
// logits and nothing else reads them (no logprobs), so a GPU head can send back the token instead of the logits.
int32_t* Scheduler::greedy_target(Sequence& seq) {
  return seq.sampler->plain_greedy() && seq.params.top_logprobs < 0 && !seq.params.constraint ? &seq.greedy_token
                                                                                              : nullptr;
}

// Samples the sequence's next token from `logits` (or takes `greedy`, the argmax Forward already computed) and
// reports it, or finishes the sequence.
void Scheduler::emit(Sequence& seq, Slot& slot, const float* logits, const int32_t* greedy) {
  const int64_t vocab = weights_.config.vocab_size;
  TokenOutput out;
  // OpenAI-style penalties count the tokens generated so far (not the prompt), as vLLM does.
  if (seq.params.constraint) {
    try {
      out.token = sample_constrained(seq, logits);
    } catch (const std::exception& e) {
      return finish(seq, "error", e.what());
    }
  } else {
    out.token = greedy ? *greedy : seq.sampler->sample(std::span(logits, size_t(vocab)), seq.generated);
  }
  if (seq.params.top_logprobs >= 0) fill_logprobs(logits, vocab, seq.params.top_logprobs, out);
  if (!seq.first_token) seq.first_token = Clock::now();
  seq.generated.push_back(out.token);
  {
    std::lock_guard lock(mutex_);
    stats_.generated_tokens_total += 1;
  }
  const auto& stops = seq.params.stop_tokens;
  if (std::find(stops.begin(), stops.end(), out.token) != stops.end()) return finish(seq, "stop");
  bool more = true;
  try {
    more = seq.observer->on_token(out);
  } catch (const std::exception& e) {
    return finish(seq, "error", e.what());
  }
  if (!more) return finish(seq, "stop");
  if (seq.params.constraint && seq.params.constraint->complete()) return finish(seq, "stop");
  if (int64_t(seq.generated.size()) >= seq.params.max_tokens) return finish(seq, "length");
  if (int64_t(slot.tokens.size()) + 1 > context_) return finish(seq, "length");  // no room to feed it
  seq.next_token = out.token;
  seq.decoding = true;
}

// Samples from a copy of the logits that the sequence's constraint masked, then advances the constraint (an end
// token finishes the sequence before the constraint would see it).
int32_t Scheduler::sample_constrained(Sequence& seq, const float* logits) {
  const size_t vocab = size_t(weights_.config.vocab_size);
  seq.masked_logits.assign(logits, logits + vocab);
  if (!seq.params.constraint->mask(seq.masked_logits, seq.params.stop_tokens))
    throw std::runtime_error("structured output: no token can continue the constrained text");
  const int32_t token = seq.sampler->sample(seq.masked_logits, seq.generated);
  const auto& stops = seq.params.stop_tokens;
  if (std::find(stops.begin(), stops.end(), token) == stops.end()) seq.params.constraint->accept(token);
  return token;
}

void Scheduler::finish(Sequence& seq, const std::string& reason, const std::string& error) {
  if (seq.done) return;
  seq.done = true;
  if (seq.slot) {
    seq.slot->busy = false;
    seq.slot->last_used = ++clock_;
    if (reason == "error") seq.slot->tokens.clear();
  }
  SequenceResult result;
  result.finish_reason = reason;
  result.error = error;
  result.prompt_tokens = int64_t(seq.params.prompt.size());
  result.cached_prompt_tokens = seq.cached;
  result.completion_tokens = int64_t(seq.generated.size());
  const auto now = Clock::now();
  result.queue_seconds = seconds_between(seq.submitted, seq.started.value_or(now));
  result.first_token_seconds = seq.first_token ? seconds_between(seq.submitted, *seq.first_token) : 0;
  {
    std::lock_guard lock(mutex_);
    stats_.sequences_finished += 1;
    if (reason == "cancelled") stats_.sequences_cancelled += 1;
  }
  try {
    seq.observer->on_finish(result);
  } catch (const std::exception& e) {
    spdlog::error("[scheduler] observer on_finish threw: {}", e.what());
  }
  seq.observer.reset();
}

}  // namespace tierlm::engine
