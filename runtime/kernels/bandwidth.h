// runtime/kernels/bandwidth.h — STREAM-like RAM bandwidth probes run on a ThreadPool, the roofline that matvec and
// the planner's decode-speed estimates are measured against.
// Owns: the probe buffers for the duration of one call (charged to the ledger's scratch account).
// Never: runs implicitly; each call touches `bytes` (x2 for copy, x3 for triad) of memory, so it takes ~a second.
#pragma once

#include <cstddef>

#include "runtime/kernels/thread_pool.h"
#include "tiering/ledger.h"

namespace tierlm::kernels {

struct BandwidthOptions {
  int repeats = 5;  // timed passes after one warm-up pass; the best is reported
  tiering::Ledger* ledger = nullptr;  // null: tiering::Ledger::global(), account "scratch"
};

// Read-only: sums a `bytes`-sized buffer split across the pool's threads. Returns GB/s (1e9 bytes per second).
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, const BandwidthOptions& options = {});
// a[i] = b[i] over two buffers of `bytes`; counts 2*bytes per pass (STREAM convention, write-allocate not counted).
double measure_copy_bandwidth_gbs(ThreadPool& pool, size_t bytes, const BandwidthOptions& options = {});
// a[i] = b[i] + s*c[i] over three float buffers of `bytes`; counts 3*bytes per pass.
double measure_triad_bandwidth_gbs(ThreadPool& pool, size_t bytes, const BandwidthOptions& options = {});

}  // namespace tierlm::kernels
