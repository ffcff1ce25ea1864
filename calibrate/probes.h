// calibrate/probes.h — the measurements behind a DeviceProfile. Each probe is bounded in time and in memory
// (ProbeOptions), reports progress through a callback (the CLI draws the bar), and leaves nothing behind (the storage
// probe's scratch file is removed even on error). Buffers go through a tiering::Ledger ("scratch").
// Never: decide anything (the Planner does), or write outside the scratch file it names.
#pragma once

#include <functional>
#include <string>

#include "calibrate/device_profile.h"
#include "calibrate/model_profile.h"

namespace tierlm::calibrate {

struct ProbeOptions {
  bool quick = false;                // the whole calibration under 20 s: smaller buffers, fewer sweep points
  double seconds_per_probe = 4.0;    // wall-clock bound of each timed probe (quick: 2.5)
  std::string storage_dir = ".";     // directory on the model's filesystem; the scratch file goes there
  // The model's own file (its largest: the expert file or shard the tier reads) for the storage sweep to read in
  // place of a scratch file it writes: the reads the tier will issue, on the file's own extents and in whatever
  // state the host's caches hold it. Used when it holds at least kStorageFileMinBytes; "" or smaller: scratch.
  std::string storage_file;
  // Bytes each probe may hold at once (its buffers, the page cache its scratch file dirties): probe_device sets it
  // from probe_memory_budget (calibrate/probe_limits.h) when 0; 0 here means no bound (tests of single probes).
  uint64_t memory_budget = 0;
  // progress(stage, done, total): stage is the probe's name; called at least once at 0 and once at total.
  std::function<void(const std::string&, size_t, size_t)> progress;
};

inline constexpr uint64_t kStorageFileMinBytes = 64ull << 20;

// The largest of a model folder's weight files (model_weight_files: *.safetensors, a packed *.tierlm), or "" (none:
// not a local folder, or nothing to read).
std::string largest_model_file(const std::string& model_dir);

// Files the probes read; tests point them at fake trees.
struct SystemPaths {
  std::string proc_meminfo = "/proc/meminfo";
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";  // v1 controllers below it (memory/), v2 at it or at unified/
  std::string thp_enabled = "/sys/kernel/mm/transparent_hugepage/enabled";
};

Topology probe_topology();
MemoryInfo probe_memory(const SystemPaths& paths = {});
// Device, filesystem and rotational flag of the filesystem holding `dir` (no timing).
StorageInfo probe_storage_identity(const std::string& dir);
// Identity plus the timed sweep: O_DIRECT reads through io_uring of random aligned offsets of a scratch file in
// `dir`, for each (block size, queue depth). Falls back to buffered reads, with a warning in StorageInfo, when
// O_DIRECT is refused, and to pread when io_uring is unavailable.
StorageInfo probe_storage(const ProbeOptions& options);
// STREAM-like read/copy/triad on each NUMA node (threads and memory bound to the node with libnuma).
std::vector<NodeBandwidth> probe_bandwidth(const Topology& topology, const ProbeOptions& options);
// OpenBLAS SGEMM GFLOP/s and our q8_0/q4 matvec GB/s for thread counts 1, 2, 4, ... up to the cores.
std::vector<ComputeSample> probe_compute(const Topology& topology, const ProbeOptions& options);
// The model's own dense prefill matrices (ModelProfile::dense_gemm_shapes, random weights in its format) timed by
// kernels::matmul at kPrefillShapeRows activation rows on a pool of `threads`: the rates prefill_seconds charges each
// shape. Within options.memory_budget (each weight and its f32 source at most a quarter; a taller weight is probed as
// a slice of its rows, as it is for more than kPrefillShapeFlops a call) and about options.seconds_per_probe in all.
inline constexpr int64_t kPrefillShapeRows[] = {16, 128};
inline constexpr double kPrefillShapeFlops = 8e9;
inline constexpr double kPrefillProbeSeconds = 1.0;  // fit's and calibrate's seconds_per_probe for it
// With them, the per-row work's seconds per element on one thread (PrefillRates::gate_seconds, row_seconds), and
// attention in KV `kv_codec` (probe_prefill_attention, for a model whose every layer is plain attention of the
// model-wide heads; else attention_seconds stays 0).
PrefillRates probe_prefill(const ModelProfile& model, int threads, const std::string& kv_codec,
                           const ProbeOptions& options);

// Prefill attention as the engine runs it (Forward::attention: KVCache::attend per row and kv head on the pool) for
// one layer of the model's heads in KV `codec`: a chunk of 128 rows at positions [0, 128), each seeing its own and
// every earlier position. Seconds per query head and position seen, on a pool of `threads`; within
// options.seconds_per_probe.
double probe_prefill_attention(const ModelProfile& model, int threads, const std::string& codec,
                               const ProbeOptions& options);

// The GPU hook: a CUDA build fills memory and host-to-device bandwidth; this build reports why there is none.
GpuInfo probe_gpu(const ProbeOptions& options);

// Everything above, in order, timed (probe_seconds), stamped with host name and time.
DeviceProfile probe_device(const ProbeOptions& options);
// The untimed parts only (topology, memory, storage identity, GPU presence): enough for the fingerprint, in
// milliseconds, so `run`/`serve` can check that wisdom still matches this machine.
DeviceProfile probe_device_identity(const std::string& storage_dir);

}  // namespace tierlm::calibrate
