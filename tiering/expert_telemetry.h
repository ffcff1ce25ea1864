// tiering/expert_telemetry.h — one snapshot of the expert tier's counters, the struct the server publishes
// (/metrics, /v1/telemetry). Plain data, copied out under no lock by the engine thread that owns the tier.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tiering/ledger.h"

namespace tierlm::tiering {

struct ExpertTierTelemetry {
  struct Layer {
    uint64_t hits = 0;           // requests served from memory (resident set or cache slot)
    uint64_t misses = 0;         // requests that had to read from disk
    uint64_t prefetches = 0;     // reads started ahead of need for this layer
    uint64_t prefetch_hits = 0;  // requests served by a prefetched slot
  };
  std::vector<Layer> layers;
  uint64_t hits = 0, misses = 0, resident_hits = 0;
  // wasted: not asked for by its layer's next routing (or evicted before it)
  uint64_t prefetches = 0, prefetch_hits = 0, prefetch_wasted = 0;
  // Guesses not read because, as measured so far, reading them did not pay (ExpertCacheOptions::adaptive_prefetch),
  // and the measures that decided: the guesses' precision (read or not), a demand read's latency, a guess's lead.
  uint64_t prefetch_skipped = 0;
  double prefetch_precision = 0, read_latency_seconds = 0, prefetch_lead_seconds = 0;
  uint64_t evictions = 0;
  uint64_t bytes_read = 0;    // bytes returned by the device for expert reads
  uint64_t reads = 0;         // read operations (after splitting into blocks)
  double read_stall_seconds = 0;  // time the forward pass waited for expert reads
  // Expert loads that failed (a read error or a short file; or, rarely, the conversion threw), demand and prefetch
  // alike: a demand load's failure failed the request that needed it, a prefetch's failed nothing but itself.
  uint64_t read_errors = 0;
  // Turning a read's bytes into the slot format (ExpertStore::finish): every conversion and the time it took, on the
  // cache's worker or the forward thread. Zero for a packed file (the read lands in the slot as is).
  uint64_t conversions = 0;
  double conversion_seconds = 0;
  // The forward pass's share: conversions it did itself (an expert it needed whose conversion had not started, or
  // all of them with the worker off), and the time it waited for the worker to finish one it needed.
  uint64_t inline_conversions = 0;
  double inline_conversion_seconds = 0;
  double conversion_wait_seconds = 0;
  // The forward pass's time in the MoE blocks of the tier's layers (routing, lookahead, waiting for reads and
  // conversions, running the experts) and, of it, running the experts (the expert GEMMs, gates and sums): a token's
  // time outside moe_seconds is attention, dense layers, sampling.
  double moe_seconds = 0;
  double expert_compute_seconds = 0;
  int64_t resident_experts = 0, cache_slots = 0;
  uint64_t expert_bytes = 0;  // one expert block in memory
  std::string policy;         // "lru" | "frequency"
  bool direct_io = false;     // every file is read with O_DIRECT
  bool io_uring = false;
  std::vector<AccountUsage> ledger;  // the ledger's accounts at snapshot time
  uint64_t ledger_budget = 0, ledger_used = 0, ledger_peak = 0;

  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

}  // namespace tierlm::tiering
