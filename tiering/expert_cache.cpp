#include "tiering/expert_cache.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/sysinfo.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tierlm::tiering {

const char* policy_name(CachePolicy p) { return p == CachePolicy::lru ? "lru" : "frequency"; }

CachePolicy parse_policy(const std::string& name) {
  if (name == "lru") return CachePolicy::lru;
  if (name == "frequency" || name == "lfu") return CachePolicy::frequency;
  throw std::invalid_argument("unknown expert cache policy '" + name + "' (accepted: lru, frequency)");
}

bool prefetch_worth_it(double precision, double read_seconds, double lead_seconds) {
  if (read_seconds <= 0) return true;
  const double saved = std::min(read_seconds, std::max(lead_seconds, 0.0));
  return precision * saved >= (1.0 - precision) * read_seconds;
}

ExpertCache::ExpertCache(const ExpertStore& store, ExpertReader& reader, Ledger& ledger, ExpertCacheOptions options)
    : store_(store), reader_(reader), ledger_(ledger), options_(std::move(options)) {
  if (options_.slots < 1 && !options_.mapped) throw std::invalid_argument("expert cache: needs at least one slot");
  const int64_t keys = store_.layers() * store_.experts();
  slot_of_.assign(size_t(keys), -1);
  resident_of_.assign(size_t(keys), -1);
  frequency_.assign(size_t(keys), 0);
  counters_.layers.resize(size_t(store_.layers()));
  guesses_.resize(size_t(store_.layers()));
  read_latency_ = std::max(0.0, options_.read_seconds_prior);
  const ExpertLayout& layout = store_.layout();
  if (options_.mapped) {
    if (store_.encoding() != ExpertEncoding::packed)
      throw std::invalid_argument("expert cache: the mmap baseline needs a packed expert file");
    const Extent last = store_.extents(store_.layers() - 1, store_.experts() - 1)[0];
    mapping_bytes_ = size_t(last.offset + last.length);
    const int fd = ::open(store_.files()[0].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(store_.files()[0] + ": " + std::strerror(errno));
    void* p = ::mmap(nullptr, mapping_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw std::runtime_error(store_.files()[0] + ": mmap failed: " + std::strerror(errno));
    mapping_ = static_cast<const std::byte*>(p);
    reader_base_ = reader_.stats();
    return;
  }

  reservation_ = store_.conversion_bytes();
  if (reservation_) ledger_.charge("expert_staging", reservation_);
  try {
    for (int64_t i = 0; i < options_.slots; ++i) {
      Slot s;
      s.block = LedgerBuffer(ledger_, accounts::expert_cache, layout.bytes, kIoAlignment);
      if (store_.staging_bytes())
        s.staging = LedgerBuffer(ledger_, accounts::expert_cache, store_.staging_bytes(), kIoAlignment);
      slots_.push_back(std::move(s));
    }
    // The resident set is read once, now, through the same reader (so its bytes are counted too).
    LedgerBuffer staging;
    if (store_.staging_bytes()) staging = LedgerBuffer(ledger_, accounts::scratch, store_.staging_bytes(), kIoAlignment);
    for (auto [layer, expert] : options_.resident) {
      if (layer < 0 || layer >= store_.layers() || expert < 0 || expert >= store_.experts())
        throw std::invalid_argument(fmt::format("expert cache: resident expert {}.{} does not exist", layer, expert));
      const int64_t k = key(layer, expert);
      if (resident_of_[size_t(k)] >= 0) continue;
      LedgerBuffer block(ledger_, accounts::resident_experts, layout.bytes, kIoAlignment);
      const auto reads = store_.plan(layer, expert, block.data(), staging.data());
      reader_.wait(reader_.submit(reads));
      store_.finish(layer, expert, staging.data(), block.data(), scratch_ledger_);
      resident_of_[size_t(k)] = int32_t(resident_blocks_.size());
      resident_blocks_.push_back(std::move(block));
    }
  } catch (...) {
    if (reservation_) ledger_.release("expert_staging", reservation_);
    throw;
  }
  reader_base_ = reader_.stats();
  if (options_.convert_on_worker && store_.encoding() != ExpertEncoding::packed)
    worker_ = std::thread([this] { worker_loop(); });
}

ExpertCache::~ExpertCache() {
  if (worker_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    worker_.join();  // after its conversion in progress, if any: that slot's memory must outlive it
  }
  if (mapping_) ::munmap(const_cast<std::byte*>(mapping_), mapping_bytes_);
  // Reads still in flight target our slots: let them land before the memory goes.
  try {
    reader_.drain();
  } catch (...) {
  }
  if (reservation_) ledger_.release("expert_staging", reservation_);
}

bool ExpertCache::resident(int64_t layer, int32_t expert) const { return resident_of_[size_t(key(layer, expert))] >= 0; }

bool ExpertCache::cached(int64_t layer, int32_t expert) const {
  if (mapping_) return true;
  const int64_t k = key(layer, expert);
  return resident_of_[size_t(k)] >= 0 || slot_of_[size_t(k)] >= 0;
}

int64_t ExpertCache::available_slots() const {
  if (mapping_) return store_.experts();
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.pins == 0;
  return n;
}

void ExpertCache::touch(int64_t k) {
  ++clock_;
  frequency_[size_t(k)] += 1;
  // Aging: halve every count once as many uses as there are experts have passed, so the policy follows shifts in
  // popularity instead of remembering the distant past forever.
  if (++uses_since_aging_ >= frequency_.size()) {
    uses_since_aging_ = 0;
    for (uint32_t& f : frequency_) f >>= 1;
  }
}

int64_t ExpertCache::choose_victim(bool for_prefetch, std::span<const int64_t> fresh) {
  int64_t best = -1;
  // Rank: empty first; then (for prefetch, never a slot still loading) the policy's coldest.
  std::lock_guard lock(mutex_);
  auto rank = [&](const Slot& s) -> std::pair<uint64_t, uint64_t> {
    if (s.state == State::empty || s.state == State::failed) return {0, 0};
    // An unpinned slot not yet used is a prefetch nobody asked for yet (a request clears the mark): kept over used
    // ones, wherever its read and conversion are (so the choice does not depend on the worker's progress).
    const uint64_t loading_penalty = s.prefetched ? (uint64_t(1) << 40) : 0;
    if (options_.policy == CachePolicy::frequency)
      return {loading_penalty + 1 + frequency_[size_t(s.key)], s.last_use};
    return {loading_penalty + 1, s.last_use};
  };
  std::pair<uint64_t, uint64_t> best_rank{std::numeric_limits<uint64_t>::max(), 0};
  for (int64_t i = 0; i < int64_t(slots_.size()); ++i) {
    const Slot& s = slots_[size_t(i)];
    if (s.pins > 0) continue;
    // A prefetch never waits for a read still in flight (a conversion in progress, of a prefetch nobody asked for,
    // is at most one expert's repack, and skipping it would make the choice depend on the worker's progress).
    if (for_prefetch && s.state == State::loading && !reader_.done(s.ticket)) continue;
    // Nor does it evict a guess of its own batch for another: whether that read had landed yet would decide it.
    if (for_prefetch && std::find(fresh.begin(), fresh.end(), i) != fresh.end()) continue;
    const auto r = rank(s);
    if (best < 0 || r < best_rank) {
      best = i;
      best_rank = r;
    }
  }
  return best;
}

ExpertCache::State ExpertCache::state_of(const Slot& s) {
  std::lock_guard lock(mutex_);
  return s.state;
}

// The slot is about to be refilled: its read must have landed (the reader writes into it) and the worker must not
// hold it; a conversion not yet started is dropped (the expert is being evicted unused).
void ExpertCache::settle(Slot& s, std::unique_lock<std::mutex>& lock) {
  if (s.state == State::staged) {
    unqueue(int32_t(&s - slots_.data()));
    s.state = State::empty;
  }
  ready_cv_.wait(lock, [&] { return s.state != State::converting; });
}

void ExpertCache::load(int64_t index, int64_t k, bool prefetch) {
  Slot& s = slots_[size_t(index)];
  if (state_of(s) == State::loading) {  // an unused prefetch still in flight
    try {
      reader_.wait(s.ticket);
    } catch (const ReaderError&) {  // its bytes are thrown away anyway; it failed all the same
      ++counters_.read_errors;
    }
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), int32_t(index)));
  }
  std::unique_lock lock(mutex_);
  settle(s, lock);
  if (s.key >= 0) {
    slot_of_[size_t(s.key)] = -1;
    ++counters_.evictions;
    if (s.prefetched) ++counters_.prefetch_wasted;
  }
  s.key = k;
  s.prefetched = prefetch;
  s.guess = prefetch;
  s.state = State::loading;
  s.error.clear();
  lock.unlock();
  s.submitted = std::chrono::steady_clock::now();
  s.last_use = clock_;
  slot_of_[size_t(k)] = int32_t(index);
  start_read(int32_t(index));
}

void ExpertCache::start_read(int32_t index) {
  Slot& s = slots_[size_t(index)];
  s.ticket = reader_.submit(
      store_.plan(s.key / store_.experts(), s.key % store_.experts(), s.block.data(), s.staging.data()));
  in_flight_.push_back(index);
}

// Nothing of a failed load stays behind: the next request of the expert misses and reads it again (the error may
// have been transient), and the slot is the next victim. Forward thread, mutex_ held; the slot is neither loading
// nor converting.
void ExpertCache::drop(Slot& s) {
  if (s.key >= 0) slot_of_[size_t(s.key)] = -1;
  s.key = -1;
  s.state = State::empty;
  s.pins = 0;
  s.prefetched = s.guess = false;
  s.error.clear();
}

std::string ExpertCache::load_error(const Slot& s, const std::string& what) const {
  return fmt::format("expert {}.{} could not be loaded: {}", s.key / store_.experts(), s.key % store_.experts(), what);
}

void ExpertCache::request(int64_t layer, std::span<const int32_t> experts) {
  auto& per_layer = counters_.layers.at(size_t(layer));
  if (mapping_) {
    per_layer.hits += experts.size();
    return;
  }
  if (Guesses& guessed = guesses_[size_t(layer)]; !guessed.experts.empty()) {
    const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - guessed.at).count();
    // Stale guesses (from a sequence that has ended) are dropped unscored. Otherwise this request is what the
    // layer's guesses were for: score them (each guess one outcome of the running mean, about the last 64
    // counting), and the lead they had to hide their reads in: the forward thread's time since, less its waits for
    // reads (the disk was busy with this layer's own misses then, and a guess's read would only have queued behind
    // them).
    if (since <= options_.stale_guess_seconds) {
      constexpr double kWeight = 1.0 / 64;
      for (int32_t g : guessed.experts) {
        const bool asked = std::find(experts.begin(), experts.end(), g) != experts.end();
        guess_precision_ += kWeight * ((asked ? 1.0 : 0.0) - guess_precision_);
      }
      const double lead = std::max(0.0, since - double(reader_.stats().stall_ns - guessed.stall_ns) * 1e-9);
      guess_lead_ = guess_lead_ > 0 ? guess_lead_ + 0.125 * (lead - guess_lead_) : lead;
    }
    guessed.experts.clear();
  }
  std::vector<int64_t> missing;
  for (int32_t e : experts) {
    if (e < 0 || e >= store_.experts()) throw std::out_of_range(fmt::format("expert {} does not exist", e));
    const int64_t k = key(layer, e);
    touch(k);
    if (resident_of_[size_t(k)] >= 0) {
      ++per_layer.hits;
      ++counters_.resident_hits;
      continue;
    }
    if (const int32_t i = slot_of_[size_t(k)]; i >= 0) {
      Slot& s = slots_[size_t(i)];
      if (s.pins == 0 && state_of(s) == State::failed) {  // a failed conversion not yet dropped: a miss
        std::lock_guard lock(mutex_);
        drop(s);
        missing.push_back(k);
        continue;
      }
      ++per_layer.hits;
      if (s.prefetched) {
        ++per_layer.prefetch_hits;
        s.prefetched = false;
      }
      ++s.pins;
      s.last_use = clock_;
      continue;
    }
    missing.push_back(k);
  }
  for (int64_t k : missing) {
    if (const int32_t i = slot_of_[size_t(k)]; i >= 0) {  // asked twice in one request
      ++slots_[size_t(i)].pins;
      ++per_layer.hits;
      continue;
    }
    const int64_t victim = choose_victim(false);
    if (victim < 0)
      throw std::length_error(fmt::format("expert cache: {} slots are all pinned; cannot load expert {}.{}",
                                          slots_.size(), layer, k % store_.experts()));
    ++per_layer.misses;
    load(victim, k, false);
    ++slots_[size_t(victim)].pins;
  }
  // A guess was for its layer's next routing, and this request is it: a guess of this layer not asked for is wasted
  // now. It stays cached (evictable as any other unpinned slot) but no longer counts against the prefetch limit.
  // Kept as a guess until evicted, the unused guesses held the limit's every place after a few tokens and the
  // lookahead stopped: at 8 GiB it covered 3-4% of the misses while its top-k held 88% of them.
  for (Slot& s : slots_)
    if (s.prefetched && s.pins == 0 && s.key >= 0 && s.key / store_.experts() == layer) {
      s.prefetched = false;
      ++counters_.prefetch_wasted;
    }
}

void ExpertCache::unqueue(int32_t slot) {
  if (const auto it = std::find(queue_.begin(), queue_.end(), slot); it != queue_.end()) queue_.erase(it);
}

void ExpertCache::dispatch() {
  if (in_flight_.empty()) return;
  bool queued = false;
  for (size_t j = 0; j < in_flight_.size();) {
    Slot& s = slots_[size_t(in_flight_[j])];
    if (!reader_.done(s.ticket)) {
      ++j;
      continue;
    }
    std::string error;
    try {
      reader_.wait(s.ticket);  // returns at once; throws the reader's error, if any
    } catch (const ReaderError& e) {
      error = e.what();
    }
    std::lock_guard lock(mutex_);
    if (!error.empty()) {
      ++counters_.read_errors;
      if (s.pins == 0) {  // a prefetch nobody has asked for yet: it fails nothing but itself
        // Logged at the 1st, 2nd, 4th, ... error, so a failing disk cannot flood the log.
        if (std::has_single_bit(counters_.read_errors))
          spdlog::warn("[tiering] prefetch dropped: {} ({} expert read errors so far)", load_error(s, error),
                       counters_.read_errors);
        drop(s);
      } else {
        s.state = State::failed;
        s.error = load_error(s, error);
      }
    } else if (store_.encoding() == ExpertEncoding::packed) {
      s.state = State::ready;
    } else {
      s.state = State::staged;
      if (worker_.joinable()) {
        queue_.push_back(in_flight_[j]);
        queued = true;
      }
    }
    in_flight_.erase(in_flight_.begin() + std::ptrdiff_t(j));
  }
  if (queued) work_cv_.notify_one();
}

void ExpertCache::convert(Slot& s, bool on_worker, kernels::ThreadPool* pool) {
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    std::unique_lock scratch(scratch_mutex_, std::defer_lock);
    if (reservation_) scratch.lock();
    store_.finish(s.key / store_.experts(), s.key % store_.experts(), s.staging.data(), s.block.data(),
                  scratch_ledger_, pool);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard lock(mutex_);
  ++conversions_;
  conversion_seconds_ += seconds;
  conversion_errors_ += !error.empty();
  if (!on_worker) {
    ++inline_conversions_;
    inline_conversion_seconds_ += seconds;
  }
  s.state = error.empty() ? State::ready : State::failed;
  s.error = error.empty() ? std::string() : load_error(s, error);
}

void ExpertCache::worker_loop() {
  // A thread inherits its creator's CPU binding, and a pinned compute pool binds its constructing thread to core 0
  // (kernels::ThreadPool): unbound, the worker runs on whichever core is free instead of queuing behind the forward
  // thread. The kernel keeps the mask within the process's cpuset.
  cpu_set_t every;
  CPU_ZERO(&every);
  for (int cpu = 0; cpu < std::min(CPU_SETSIZE, get_nprocs_conf()); ++cpu) CPU_SET(cpu, &every);
  sched_setaffinity(0, sizeof(every), &every);  // best effort: a refusal leaves the inherited binding
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Slot& s = slots_[size_t(queue_.front())];
    queue_.pop_front();
    s.state = State::converting;
    lock.unlock();
    convert(s, /*on_worker=*/true);
    ready_cv_.notify_all();
    lock.lock();
  }
}

ExpertViews ExpertCache::acquire(int64_t layer, int32_t expert, kernels::ThreadPool* pool) {
  const int64_t k = key(layer, expert);
  if (mapping_) return store_.layout().views(mapping_ + store_.extents(layer, expert)[0].offset);
  if (const int32_t r = resident_of_[size_t(k)]; r >= 0) return store_.layout().views(resident_blocks_[size_t(r)].data());
  const int32_t i = slot_of_[size_t(k)];
  if (i < 0 || slots_[size_t(i)].pins == 0)
    throw std::logic_error(fmt::format("expert cache: expert {}.{} acquired without a request", layer, expert));
  Slot& s = slots_[size_t(i)];
  dispatch();
  std::unique_lock lock(mutex_);
  bool waited_for_demand_read = false;
  for (;;) {
    if (waited_for_demand_read && s.state != State::loading) {
      // The read this request started has landed while the forward thread waited: its whole latency.
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.submitted).count();
      read_latency_ = read_latency_ > 0 ? read_latency_ + 0.125 * (seconds - read_latency_) : seconds;
      waited_for_demand_read = false;
    }
    switch (s.state) {
      case State::ready:
        return store_.layout().views(s.block.data());
      case State::failed: {
        if (s.guess) {  // it failed while only a prefetch: this request reads it again
          s.guess = false;
          s.state = State::loading;
          s.error.clear();
          lock.unlock();
          start_read(i);
          lock.lock();
          break;
        }
        const std::string error = std::move(s.error);
        drop(s);  // thrown once, to this request; the next one reads the expert again
        throw ReaderError(error);
      }
      case State::staged:  // landed, not yet started by the worker: convert it here rather than wait behind others
        unqueue(i);
        s.state = State::converting;
        lock.unlock();
        convert(s, /*on_worker=*/false, pool);
        lock.lock();
        break;
      case State::converting: {
        const auto start = std::chrono::steady_clock::now();
        ready_cv_.wait(lock, [&] { return s.state != State::converting; });
        conversion_wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        break;
      }
      case State::loading:  // hand on whatever lands while waiting for this one
        lock.unlock();
        if (!reader_.done(s.ticket)) {
          waited_for_demand_read = waited_for_demand_read || !s.guess;
          reader_.wait_any();
        }
        dispatch();
        lock.lock();
        break;
      case State::empty:
        throw std::logic_error(fmt::format("expert cache: expert {}.{} has no read", layer, expert));
    }
  }
}

void ExpertCache::release(int64_t layer, int32_t expert) {
  if (mapping_) return;
  dispatch();
  const int64_t k = key(layer, expert);
  if (resident_of_[size_t(k)] >= 0) return;
  const int32_t i = slot_of_[size_t(k)];
  if (i < 0 || slots_[size_t(i)].pins == 0) return;  // (an expert whose acquire threw has no slot any more)
  Slot& s = slots_[size_t(i)];
  if (--s.pins > 0) return;
  std::lock_guard lock(mutex_);
  if (s.state == State::failed) drop(s);  // requested, never acquired, and its load failed
}

void ExpertCache::prefetch(int64_t layer, std::span<const int32_t> experts) {
  if (mapping_ || options_.prefetch_limit <= 0 || layer < 0 || layer >= store_.layers()) return;
  // The guesses not in memory, scored at the layer's next request whether read or not.
  Guesses& guessed = guesses_[size_t(layer)];
  guessed.experts.clear();
  for (int32_t e : experts)
    if (e >= 0 && e < store_.experts() && !cached(layer, e)) guessed.experts.push_back(e);
  guessed.at = std::chrono::steady_clock::now();
  guessed.stall_ns = reader_.stats().stall_ns;
  if (options_.adaptive_prefetch && !prefetch_worth_it(guess_precision_, read_latency_, guess_lead_)) {
    counters_.prefetch_skipped += guessed.experts.size();
    return;
  }
  // Prefetched experts not yet asked for (a request clears the mark), whether their reads are still in flight or
  // have landed: the limit bounds the slots speculation holds.
  int64_t in_flight = 0;
  for (const Slot& s : slots_) in_flight += s.prefetched;
  std::vector<int64_t> loaded;
  for (int32_t e : experts) {
    if (in_flight >= options_.prefetch_limit) break;
    if (e < 0 || e >= store_.experts() || cached(layer, e)) continue;
    const int64_t victim = choose_victim(true, loaded);
    if (victim < 0) break;
    load(victim, key(layer, e), true);
    loaded.push_back(victim);
    ++counters_.layers[size_t(layer)].prefetches;
    ++in_flight;
  }
}

ExpertTierTelemetry ExpertCache::telemetry() const {
  ExpertTierTelemetry t = counters_;
  t.hits = t.misses = t.prefetches = t.prefetch_hits = 0;
  for (const auto& l : t.layers) {
    t.hits += l.hits;
    t.misses += l.misses;
    t.prefetches += l.prefetches;
    t.prefetch_hits += l.prefetch_hits;
  }
  const ReaderStats& r = reader_.stats();
  t.bytes_read = r.bytes_read - reader_base_.bytes_read;
  t.reads = r.reads - reader_base_.reads;
  t.read_stall_seconds = double(r.stall_ns - reader_base_.stall_ns) * 1e-9;
  {
    std::lock_guard lock(mutex_);
    t.conversions = conversions_;
    t.conversion_seconds = conversion_seconds_;
    t.inline_conversions = inline_conversions_;
    t.inline_conversion_seconds = inline_conversion_seconds_;
    t.conversion_wait_seconds = conversion_wait_seconds_;
    t.read_errors += conversion_errors_;
  }
  t.prefetch_precision = guess_precision_;
  t.read_latency_seconds = read_latency_;
  t.prefetch_lead_seconds = guess_lead_;
  t.resident_experts = int64_t(resident_blocks_.size());
  t.cache_slots = int64_t(slots_.size());
  t.expert_bytes = store_.layout().bytes;
  t.policy = mapping_ ? "mmap" : policy_name(options_.policy);
  t.direct_io = true;
  for (size_t f = 0; f < reader_.files().size(); ++f) t.direct_io = t.direct_io && reader_.direct(int32_t(f));
  t.io_uring = reader_.using_io_uring();
  t.ledger = ledger_.snapshot();
  t.ledger_budget = ledger_.budget();
  t.ledger_used = ledger_.used();
  t.ledger_peak = ledger_.peak();
  return t;
}

void ExpertCache::reset_counters() {
  const size_t layers = counters_.layers.size();
  counters_ = ExpertTierTelemetry{};
  counters_.layers.resize(layers);
  {
    std::lock_guard lock(mutex_);
    conversions_ = inline_conversions_ = conversion_errors_ = 0;
    conversion_seconds_ = inline_conversion_seconds_ = conversion_wait_seconds_ = 0;
  }
  reader_base_ = reader_.stats();
}

}  // namespace tierlm::tiering
