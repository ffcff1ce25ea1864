// tiering/expert_cache.h — which experts are in memory: a pinned resident set (the hot experts a plan chose, never
// evicted) plus a fixed number of cache slots managed by LRU or a frequency-aware policy (LFU with periodic aging,
// LRU among equals). Misses are read through the ExpertReader; prefetch() starts reads of experts the next layer
// is likely to need so they overlap the current layer's compute.
// Owns: resident blocks (ledger account "resident_experts"), slots and their staging (account "expert_cache"), a
// reservation for conversion scratch ("expert_staging"), and the counters. Never: evict a pinned (requested,
// not yet released) expert, exceed its slot count, or allocate outside the ledger.
#pragma once

#include <cstdint>
#include <span>
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
  // Baseline, not a tier: experts used in place from a read-only mmap of a packed file, so the kernel's page cache
  // decides what stays in memory (no slots, no reads of ours, nothing charged). For comparisons only.
  bool mapped = false;
};

class ExpertCache {
 public:
  ExpertCache(const ExpertStore& store, ExpertReader& reader, Ledger& ledger, ExpertCacheOptions options);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Pins the experts and starts reads for the ones not in memory. Throws std::length_error if the unpinned slots
  // cannot hold the misses (ask for at most available_slots() distinct new experts at once).
  void request(int64_t layer, std::span<const int32_t> experts);
  // Waits for a requested expert's read (counted as stall) and returns its weights; valid until release().
  ExpertViews acquire(int64_t layer, int32_t expert);
  void release(int64_t layer, int32_t expert);
  // Starts reads of likely experts into slots that hold nothing pinned; never blocks, never evicts a pinned expert.
  void prefetch(int64_t layer, std::span<const int32_t> experts);
  bool resident(int64_t layer, int32_t expert) const;
  bool cached(int64_t layer, int32_t expert) const;  // resident or in a slot (ready or loading)
  int64_t available_slots() const;                   // slots with no pinned expert

  ExpertTierTelemetry telemetry() const;
  void reset_counters();
  const ExpertStore& store() const { return store_; }
  const ExpertCacheOptions& options() const { return options_; }

 private:
  enum class State : uint8_t { empty, loading, ready };
  struct Slot {
    LedgerBuffer block, staging;
    int64_t key = -1;
    State state = State::empty;
    int32_t pins = 0;
    uint64_t ticket = 0;
    uint64_t last_use = 0;
    bool prefetched = false;
  };
  int64_t key(int64_t layer, int64_t expert) const { return layer * store_.experts() + expert; }
  int64_t choose_victim(bool for_prefetch);
  void load(int64_t slot, int64_t key, bool prefetch);
  void finish(Slot& s);
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
  ExpertTierTelemetry counters_;
  ReaderStats reader_base_;
  const std::byte* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
};

}  // namespace tierlm::tiering
