// tiering/expert_tier.h — the expert tier of one MoE model: its ExpertStore, ExpertReader and ExpertCache,
// built together and destroyed in the right order (the cache drains the reader before its slots go).
#pragma once

#include <memory>

#include "tiering/expert_cache.h"
#include "tiering/expert_reader.h"
#include "tiering/expert_store.h"

namespace tierlm::tiering {

struct ExpertTierOptions {
  ExpertCacheOptions cache;  // cache.slots == 0: as many slots as the ledger has room for (see below)
  ReaderOptions reader;
  uint64_t leave_free_bytes = 0;  // automatic sizing keeps this much of the budget for KV and scratch
  int64_t min_slots = 1;          // automatic sizing fails below this (one token's top-k)
  int64_t max_slots = 0;          // automatic sizing takes at most this many (0: up to every expert)
};

// Slots that fit in what the ledger has left, after the resident set, the conversion reservation and
// leave_free_bytes. Throws LedgerError when fewer than min_slots fit.
int64_t automatic_slots(const ExpertStore& store, const Ledger& ledger, const ExpertTierOptions& options);

class ExpertTier {
 public:
  ExpertTier(ExpertStore store, Ledger& ledger, const ExpertTierOptions& options)
      : store_(std::make_unique<ExpertStore>(std::move(store))),
        reader_(std::make_unique<ExpertReader>(store_->files(), options.reader)) {
    ExpertCacheOptions cache = options.cache;
    if (cache.slots == 0 && !cache.mapped) cache.slots = automatic_slots(*store_, ledger, options);
    cache_ = std::make_unique<ExpertCache>(*store_, *reader_, ledger, std::move(cache));
  }
  ~ExpertTier() { cache_.reset(); }

  ExpertStore& store() { return *store_; }
  ExpertReader& reader() { return *reader_; }
  ExpertCache& cache() { return *cache_; }
  ExpertTierTelemetry telemetry() const { return cache_->telemetry(); }

 private:
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<ExpertReader> reader_;
  std::unique_ptr<ExpertCache> cache_;
};

}  // namespace tierlm::tiering
