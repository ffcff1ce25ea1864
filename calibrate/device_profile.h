// calibrate/device_profile.h — what the probes measured about this machine: topology, memory limits, storage under
// the model, RAM bandwidth per NUMA node, compute by thread count, GPU. Plain data with a JSON form (the wisdom file
// and profiles/devices/*.json use it) and a fingerprint of the parts that identify the hardware.
// Never: measure anything itself (calibrate/probes.h does), or hold an opinion on what to do with the numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

namespace tierlm::calibrate {

struct CacheLevel {
  int level = 0;           // 1, 2, 3
  uint64_t bytes = 0;      // size of one instance
  int instances = 0;       // how many of them hwloc sees
};

struct Topology {
  std::string cpu_model;
  int packages = 1, numa_nodes = 1, cores = 1, threads = 1;  // threads: hardware threads (PUs)
  std::vector<CacheLevel> caches;                              // data/unified caches, L1 first
  std::string isa;                                             // kernels' dispatch: scalar | avx2 | avx512
};

struct MemoryInfo {
  uint64_t total = 0;                     // MemTotal
  uint64_t available = 0;                 // MemAvailable
  std::optional<uint64_t> cgroup_v1_limit;  // memory.limit_in_bytes (tightest on the path), when limited
  std::optional<uint64_t> cgroup_v2_limit;  // memory.max (tightest on the path), when limited
  uint64_t cgroup_usage = 0;              // current charge of our cgroup, where a limit applies
  uint64_t hugepage_bytes = 0;            // Hugepagesize
  uint64_t hugepages_total = 0, hugepages_free = 0;
  std::string transparent_hugepages;      // the bracketed mode of THP "enabled", e.g. "madvise"
  // What this process may use: min(MemTotal, cgroup limits).
  uint64_t limit() const;
  // What a plan may count on now: min(MemAvailable, limit - cgroup usage).
  uint64_t usable() const;
};

struct StorageSample {
  uint64_t block_size = 0;
  unsigned queue_depth = 0;
  double gbs = 0;    // 1e9 bytes per second
  double iops = 0;   // reads per second
  // CPU seconds the submitting thread spent per read (io_uring submit and reap, the kernel's page pinning of an
  // O_DIRECT read, the syscalls): the cost a reader pays per request on the thread waiting for it. 0: not measured
  // (a profile from before it was probed).
  double cpu_seconds_per_read = 0;
};

struct StorageInfo {
  std::string path;         // the directory probed (the model's)
  std::string device;       // block device name, e.g. "vda" ("" when unknown: tmpfs, overlay without a device)
  std::string filesystem;   // ext4, xfs, tmpfs, ...
  bool rotational = false;
  bool direct_io = false;   // O_DIRECT accepted; false: the numbers are buffered reads (page cache)
  bool io_uring = false;
  std::string warning;      // why a fallback was used
  std::string file;         // the file the sweep read: the model's own (ProbeOptions::storage_file); "": a scratch file
  std::vector<StorageSample> sweep;
  // The best sample's bandwidth, and reads/s of 4 KiB reads at the deepest queue.
  double best_gbs() const;
  double iops_4k() const;
  // The sample at exactly (block, depth), or nullptr.
  const StorageSample* find(uint64_t block, unsigned depth) const;
};

struct NodeBandwidth {
  int node = 0;
  int threads = 0;
  double read_gbs = 0, copy_gbs = 0, triad_gbs = 0;
};

struct ComputeSample {
  int threads = 0;
  double sgemm_gflops = 0;   // OpenBLAS SGEMM
  double matvec_q8_gbs = 0;  // our q8_0 matvec: weight bytes streamed per second
  double matvec_q4_gbs = 0;  // our q4 matvec
  // Dense formats decode converts on the fly (0: not probed, e.g. an older profile; the planner then takes q8's).
  double matvec_f16_gbs = 0, matvec_bf16_gbs = 0, matvec_f32_gbs = 0;
  // Prefill's GEMM as the engine runs it (kernels::matmul of 128 activation rows, and of 16: an expert's share of
  // a chunk's rows), flops per second by weight format name ("f32", "f16", "bf16", "q8_0", "q4", "mlx_q4",
  // "mxfp4"). Empty in older profiles: the planner then takes the SGEMM probe at kGemmEfficiency.
  std::map<std::string, double> matmul_gflops, matmul16_gflops;
  // MoE prefill's experts by format, GFLOP/s: a layer's experts on the engine's lanes (each thread whole experts,
  // gate_up and down GEMMs of 16 rows each; calibrate/speed_probes.cpp probe_expert_gemm); optional (profiles
  // written before it lack it; those before the lanes timed one expert after another, each split over the pool).
  std::map<std::string, double> expert_gemm_gflops;
};

struct GpuInfo {
  bool present = false;
  std::string reason;        // why none is used ("no GPU backend in this build")
  std::string name;
  uint64_t memory = 0;       // device memory
  uint64_t free_memory = 0;  // free when probed (0: unknown, take `memory`)
  double h2d_gbs = 0;        // pinned host-to-device copy bandwidth
  double memory_gbs = 0;     // device memory bandwidth
};

struct DeviceProfile {
  static constexpr int kSchemaVersion = 1;
  std::string hostname;
  std::string measured_at;   // ISO 8601 UTC
  bool quick = false;        // measured with --quick (shorter, noisier)
  double probe_seconds = 0;  // wall time of the whole calibration
  Topology topology;
  MemoryInfo memory;
  StorageInfo storage;
  std::vector<NodeBandwidth> bandwidth;  // one per NUMA node
  std::vector<ComputeSample> compute;    // one per thread count
  GpuInfo gpu;

  // Identity of the hardware (not of its measurements): CPU model, packages/cores/threads/NUMA nodes, MemTotal and
  // cgroup limit to the GiB, the model filesystem's device and kind, GPU name. 16 hex digits.
  std::string fingerprint() const;
  // A person-readable line of the same parts, for "hardware changed" messages.
  std::string identity() const;
  // Best read bandwidth over nodes (the roofline for decode).
  double read_gbs() const;
};

boost::json::value to_json(const DeviceProfile& p);
// Throws std::runtime_error naming the missing or mistyped field.
DeviceProfile device_profile_from_json(const boost::json::value& v);
DeviceProfile load_device_profile(const std::string& path);

// FNV-1a 64 of a string, as 16 hex digits: the fingerprint hash.
std::string fingerprint_hash(const std::string& text);

}  // namespace tierlm::calibrate
