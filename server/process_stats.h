// server/process_stats.h — what the kernel says about this process's memory: resident set (/proc/self/statm) and the
// memory limit of its cgroup (v2 memory.max, v1 memory.limit_in_bytes), for /health and /metrics.
// Never: throws — a missing or unreadable file yields "unknown" (nullopt), since /health must always answer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace tierlm::server {

std::optional<uint64_t> resident_set_bytes(const std::filesystem::path& statm = "/proc/self/statm");
// The process's peak resident set (VmHWM in /proc/self/status).
std::optional<uint64_t> peak_resident_set_bytes(const std::filesystem::path& status = "/proc/self/status");

struct CgroupMemory {
  int version = 0;                      // 1, 2, or 0 when no memory controller was found
  std::optional<uint64_t> limit_bytes;  // nullopt: unlimited or unknown
  std::optional<uint64_t> usage_bytes;
  std::string path;                     // the cgroup directory read
};

// proc_cgroup: /proc/self/cgroup; root: the cgroup filesystem mount (/sys/fs/cgroup). Tests pass fake trees.
CgroupMemory cgroup_memory(const std::filesystem::path& proc_cgroup = "/proc/self/cgroup",
                           const std::filesystem::path& root = "/sys/fs/cgroup");

}  // namespace tierlm::server
