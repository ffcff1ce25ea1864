// calibrate/probe_limits.h — how large the probes may be on this machine: the memory they may hold at once (a stated
// share of what this process may use now: the tightest cgroup v1/v2 limit minus the group's usage, and
// MemAvailable), and a plausible size for each cache level (hwloc's figure, clamped where a VM reports its host's
// whole L3 for the few cores it was given).
// Never: time or allocate anything itself; probes ask it for their sizes.
#pragma once

#include <cstdint>
#include <string>

#include "calibrate/device_profile.h"

namespace tierlm::calibrate {

// The probes hold at most this share of MemoryInfo::usable() at once. The rest is margin: the process itself (code,
// libraries, thread stacks), the page cache the cgroup charges, the model profile that runs after the probes, and
// the estimate's own error (usage moves while we measure).
inline constexpr double kProbeMemoryShare = 0.5;
// No shipping CPU has more last-level cache per core than this (AMD's 3D V-Cache parts: 12 MiB per core; Intel's
// largest L3s: under 5 MiB per core), so more per visible core is a VM's view of its host's whole cache.
inline constexpr uint64_t kMaxCacheBytesPerCore = 32ull << 20;
// Below this the probes cannot measure anything meaningful: calibration refuses with the numbers.
inline constexpr uint64_t kMinProbeMemoryBytes = 16ull << 20;

// Bytes the probes may hold at once; `why` (optional) receives the arithmetic for the log.
uint64_t probe_memory_budget(const MemoryInfo& memory, std::string* why = nullptr);

// A cache level whose size is implausible for the cores that share it is clamped to kMaxCacheBytesPerCore per core;
// returns the reason (empty when the size stands).
std::string clamp_cache_level(CacheLevel& level, int cores_sharing);

}  // namespace tierlm::calibrate
