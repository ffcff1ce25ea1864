// tiering/expert_tier.h — the expert tier of one MoE model: its ExpertStore, ExpertReader and ExpertCache,
// built together and destroyed in the right order (the cache drains the reader before its slots go).
#pragma once

#include <memory>

#include "tiering/expert_cache.h"
#include "tiering/expert_reader.h"
#include "tiering/expert_store.h"

namespace tierlm::tiering {

struct ExpertTierOptions {
  ExpertCacheOptions cache;
  ReaderOptions reader;
};

class ExpertTier {
 public:
  ExpertTier(ExpertStore store, Ledger& ledger, const ExpertTierOptions& options)
      : store_(std::make_unique<ExpertStore>(std::move(store))),
        reader_(std::make_unique<ExpertReader>(store_->files(), options.reader)),
        cache_(std::make_unique<ExpertCache>(*store_, *reader_, ledger, options.cache)) {}
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
