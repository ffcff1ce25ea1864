#include "tiering/expert_tier.h"

#include <fmt/format.h>

namespace tierlm::tiering {

int64_t automatic_slots(const ExpertStore& store, const Ledger& ledger, const ExpertTierOptions& options) {
  const uint64_t slot = store.layout().bytes + align_up(store.staging_bytes(), kIoAlignment);
  const uint64_t fixed = store.conversion_bytes() + options.cache.resident.size() * store.layout().bytes +
                         align_up(store.staging_bytes(), kIoAlignment) + options.leave_free_bytes;
  const uint64_t available = ledger.available();
  const int64_t slots = available > fixed ? int64_t((available - fixed) / slot) : 0;
  if (slots < options.min_slots)
    throw LedgerError(fmt::format("memory budget too small for the expert cache: {} bytes left fit {} expert slots "
                                  "of {} bytes, at least {} are needed",
                                  available, slots, slot, options.min_slots));
  const int64_t every = store.layers() * store.experts();
  return std::min<int64_t>(slots, options.max_slots > 0 ? std::min(options.max_slots, every) : every);
}

}  // namespace tierlm::tiering
