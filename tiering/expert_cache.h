// tiering/expert_cache.h — which experts are in memory: a pinned resident set (the hot experts a plan chose, never
// evicted) plus a fixed number of cache slots managed by LRU or a frequency-aware policy (LFU with periodic aging,
// LRU among equals). Misses are read through the ExpertReader; prefetch() starts reads of experts the next layer
// is likely to need so they overlap the current layer's compute.
// A read that lands in a staging block (every encoding but packed) still has to be converted into the slot format
// (ExpertStore::finish). That runs on a conversion worker, one thread per cache: acquire() and release() hand every
// slot whose read has completed to it, so the forward thread computes the experts in memory (and the earlier misses)
// while the later ones are repacked, and waits only for an expert that is not yet ready; an expert it needs whose
// read has landed but whose conversion has not started is converted right there instead of waiting behind others.
// Threads: every public member is called from one thread (the forward thread that owns the tier, as the reader's);
// the worker only ever touches a slot it has claimed from the queue (its staging and block, read-only store) and
// the conversion counters, under mutex_.
// Owns: resident blocks (ledger account "resident_experts"), slots and their staging (account "expert_cache"), a
// reservation for conversion scratch ("expert_staging": one conversion's worth, so conversions that need scratch
// run one at a time), the worker, and the counters. Never: evict a pinned (requested, not yet released) expert,
// exceed its slot count, reuse a slot the worker is converting, or allocate outside the ledger.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tiering/expert_store.h"
#include "tiering/expert_telemetry.h"

namespace tierlm::tiering {

enum class CachePolicy : uint8_t { lru, frequency };
const char* policy_name(CachePolicy p);
CachePolicy parse_policy(const std::string& name);  // "lru" | "frequency"; throws std::invalid_argument

struct ExpertCacheOptions {
  int64_t slots = 8;                                       // evictable slots (at least 1)
  CachePolicy policy = CachePolicy::lru;
  std::vector<std::pair<int64_t, int64_t>> resident;       // (layer, expert) kept in memory for the whole run
  int64_t prefetch_limit = 8;                              // prefetch reads in flight at most; 0 disables prefetch
  // Sparse layers ahead whose experts single-sequence decode guesses (engine::MoeBlock: each of them from the
  // current hidden state through that layer's router). 1: the next one only; more starts reads earlier, so a disk
  // slower than a layer's compute is kept busy, at more wasted guesses. prefetch_limit bounds them all together.
  int64_t lookahead_layers = 1;
  // Baseline, not a tier: experts used in place from a read-only mmap of a packed file, so the kernel's page cache
  // decides what stays in memory (no slots, no reads of ours, nothing charged). For comparisons only.
  bool mapped = false;
  // Reads a guess only while guesses pay (prefetch_worth_it): a guess read in time saves at most the time between
  // the guess and its layer's request, a wasted one costs a whole read of the disk's time. Guesses are still made
  // and scored while none are read, so reading resumes when they get better. false: every guess is read (up to
  // prefetch_limit), as before.
  bool adaptive_prefetch = true;
  // A demand read's latency assumed until one is measured (seconds; 0: none, guesses are read until a read the
  // forward thread waited for has been timed).
  double read_seconds_prior = 0;
  // Guesses older than this when their layer is next requested are dropped unscored: the sequence ended (the server
  // went idle, or a new prompt's prefill asks next), and neither their precision nor their lead says anything.
  double stale_guess_seconds = 1.0;
  // Conversions of arrived reads on the cache's worker thread (above); false: on the forward thread inside
  // acquire(), as a comparison baseline. Either way the slot's bytes are the same.
  bool convert_on_worker = true;
};

// Whether reading guesses pays, from their measured precision (the share of guessed experts their layer's next
// request asked for), a demand read's latency and the time between a guess and its layer's request: a guess read
// saves at most min(read, lead) when right and costs a read's worth of the disk when wrong, so reads pay while
// precision x min(read, lead) >= (1 - precision) x read. No read measured yet (read <= 0): true.
bool prefetch_worth_it(double precision, double read_seconds, double lead_seconds);

class ExpertCache {
 public:
  ExpertCache(const ExpertStore& store, ExpertReader& reader, Ledger& ledger, ExpertCacheOptions options);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Pins the experts and starts reads for the ones not in memory. Throws std::length_error if the unpinned slots
  // cannot hold the misses (ask for at most available_slots() distinct new experts at once).
  void request(int64_t layer, std::span<const int32_t> experts);
  // Waits for a requested expert's read (counted as read stall) and its conversion (conversion wait, or done right
  // here if it has not started), and returns its weights; valid until release(). If its read (or conversion)
  // failed, throws ReaderError naming the expert (layer.expert), the file and the offset, once: the slot is dropped
  // (unpinned, its key forgotten), so a later request of the expert reads it again. A read that failed while it was
  // only a prefetch is read again here instead (the failure belongs to the guess, not to this request).
  // `pool`: the caller's compute pool, idle while it waits here (never from inside its parallel_for); a conversion
  // done here is split over it (ExpertStore::finish).
  ExpertViews acquire(int64_t layer, int32_t expert, kernels::ThreadPool* pool = nullptr);
  // Unpins; also hands reads that have landed meanwhile to the worker (never blocks). Releasing an expert whose
  // acquire threw is a no-op; an unpinned slot whose load failed is dropped.
  void release(int64_t layer, int32_t expert);
  // Starts reads of likely experts into slots that hold nothing pinned; never blocks, never evicts a pinned expert.
  // A prefetch whose read fails is dropped and counted (read_errors), never thrown into a request.
  // A guess is for its layer's next request(): one that request does not ask for is counted wasted there and stays
  // only as a cached expert.
  void prefetch(int64_t layer, std::span<const int32_t> experts);
  bool resident(int64_t layer, int32_t expert) const;
  bool cached(int64_t layer, int32_t expert) const;  // resident or in a slot (ready or loading)
  int64_t available_slots() const;                   // slots with no pinned expert

  ExpertTierTelemetry telemetry() const;
  void reset_counters();
  // The caller's (MoE block's) time in one accumulate and its experts' compute: counted with the tier's telemetry.
  void add_moe_time(double moe_seconds, double expert_compute_seconds) {
    counters_.moe_seconds += moe_seconds;
    counters_.expert_compute_seconds += expert_compute_seconds;
  }
  const ExpertStore& store() const { return store_; }
  const ExpertCacheOptions& options() const { return options_; }

 private:
  // empty -> loading (read in flight) -> staged (read landed; queued for the worker) -> converting -> ready;
  // packed reads go from loading straight to ready. failed: the read or the conversion threw (error says why).
  enum class State : uint8_t { empty, loading, staged, converting, ready, failed };
  struct Slot {
    LedgerBuffer block, staging;
    int64_t key = -1;
    State state = State::empty;  // written by the worker (converting -> ready/failed) under mutex_ only
    int32_t pins = 0;
    uint64_t ticket = 0;
    uint64_t last_use = 0;
    bool prefetched = false;
    bool guess = false;  // the read in flight (or failed) was started by prefetch(), even if requested since
    std::chrono::steady_clock::time_point submitted;  // when its read started
    std::string error;
  };
  int64_t key(int64_t layer, int64_t expert) const { return layer * store_.experts() + expert; }
  // for_prefetch: skips unpinned slots whose reads are still in flight and the slots in `fresh` (this prefetch's
  // own loads).
  int64_t choose_victim(bool for_prefetch, std::span<const int64_t> fresh = {});
  void load(int64_t slot, int64_t key, bool prefetch);
  void start_read(int32_t slot);                   // submits the slot's reads (state already loading)
  void drop(Slot& s);                              // a failed load: forget its key, unpin, empty (under mutex_)
  std::string load_error(const Slot& s, const std::string& what) const;  // names the expert
  void dispatch();                                 // slots whose reads have landed -> staged (and to the worker)
  void settle(Slot& s, std::unique_lock<std::mutex>& lock);  // waits out a conversion the worker holds
  void convert(Slot& s, bool on_worker, kernels::ThreadPool* pool = nullptr);  // ExpertStore::finish; counts it
  void worker_loop();
  void unqueue(int32_t slot);                      // drops a staged slot from the worker's queue (under mutex_)
  State state_of(const Slot& s);
  void touch(int64_t key);

  const ExpertStore& store_;
  ExpertReader& reader_;
  Ledger& ledger_;
  ExpertCacheOptions options_;
  Ledger scratch_ledger_;      // conversion temporaries; their worst case is reserved in ledger_ up front
  uint64_t reservation_ = 0;
  std::vector<Slot> slots_;
  std::vector<LedgerBuffer> resident_blocks_;
  std::vector<int32_t> slot_of_;      // per key: slot index or -1
  std::vector<int32_t> resident_of_;  // per key: resident block index or -1
  std::vector<uint32_t> frequency_;   // per key, aged
  uint64_t clock_ = 0, uses_since_aging_ = 0;
  int64_t prefetch_in_flight_ = 0;
  // The prefetch gate (adaptive_prefetch): per layer, the experts guessed for its next request that were not in
  // memory when guessed (read or not) and when; running means of the guesses' precision, of a demand read's latency
  // (reads the forward thread waited for) and of the lead from a guess to its layer's request less the forward
  // thread's waits for reads meanwhile (the disk was busy then: only the compute between can hide a guess's read).
  struct Guesses {
    std::vector<int32_t> experts;
    std::chrono::steady_clock::time_point at;
    uint64_t stall_ns = 0;  // the reader's stall counter at the guess
  };
  std::vector<Guesses> guesses_;  // per layer
  double guess_precision_ = 1.0, read_latency_ = 0, guess_lead_ = 0;
  ExpertTierTelemetry counters_;
  ReaderStats reader_base_;
  const std::byte* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;

  std::vector<int32_t> in_flight_;  // slots in state loading, in submit order
  mutable std::mutex mutex_;        // slot states staged/converting/ready/failed, queue_, worker counters
  std::mutex scratch_mutex_;        // one scratch-using conversion at a time (the reservation covers one)
  std::condition_variable work_cv_, ready_cv_;
  std::deque<int32_t> queue_;       // staged slots for the worker, in arrival order
  bool stopping_ = false;
  // Conversion counters, written by both threads under mutex_: all conversions, and the forward thread's share.
  uint64_t conversions_ = 0, inline_conversions_ = 0, conversion_errors_ = 0;
  double conversion_seconds_ = 0, inline_conversion_seconds_ = 0, conversion_wait_seconds_ = 0;
  std::thread worker_;  // last: started once the slots exist, joined first
};

}  // namespace tierlm::tiering
