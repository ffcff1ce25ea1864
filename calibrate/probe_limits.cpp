// calibrate/probe_limits.cpp — the probes' memory budget and the cache-size clamp.
#include "calibrate/probe_limits.h"

#include <algorithm>

#include <fmt/format.h>

namespace tierlm::calibrate {

namespace {
std::string mib(uint64_t b) { return fmt::format("{:.0f} MiB", double(b) / double(1 << 20)); }
}  // namespace

uint64_t probe_memory_budget(const MemoryInfo& m, std::string* why) {
  const uint64_t usable = m.usable();
  const uint64_t budget = uint64_t(double(usable) * kProbeMemoryShare);
  if (why) {
    std::string limit = "no cgroup limit";
    if (m.cgroup_v1_limit || m.cgroup_v2_limit)
      limit = fmt::format("cgroup limit {} with {} in use", mib(m.limit()), mib(m.cgroup_usage));
    *why = fmt::format("{:.0f}% of the {} usable now (MemAvailable {}, {})", kProbeMemoryShare * 100, mib(usable),
                       mib(m.available), limit);
  }
  return budget;
}

std::string clamp_cache_level(CacheLevel& level, int cores_sharing) {
  const uint64_t bound = uint64_t(std::max(cores_sharing, 1)) * kMaxCacheBytesPerCore;
  if (level.bytes <= bound) return {};
  const std::string reason =
      fmt::format("hwloc reports a {} L{} shared by {} core{}, more than {} per core: the host's cache seen from a VM; "
                  "taken as {}",
                  mib(level.bytes), level.level, cores_sharing, cores_sharing == 1 ? "" : "s",
                  mib(kMaxCacheBytesPerCore), mib(bound));
  level.bytes = bound;
  return reason;
}

}  // namespace tierlm::calibrate
