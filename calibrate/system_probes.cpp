// calibrate/system_probes.cpp — the untimed probes: hwloc topology, /proc/meminfo + cgroup v1/v2 limits + huge
// pages, the GPU hook, and the identity-only device profile used to check wisdom against this machine.
#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "calibrate/probe_limits.h"
#include "calibrate/probes.h"
#include "runtime/gpu/gpu_probe.h"

namespace tierlm::calibrate {

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// A cgroup limit file: a byte count, or "max" (v2) / a huge page-rounded number (v1) meaning unlimited.
std::optional<uint64_t> read_limit(const std::string& path) {
  const std::string line = read_first_line(path);
  if (line.empty() || line == "max") return std::nullopt;
  try {
    const uint64_t v = std::stoull(line);
    if (v >= (uint64_t(1) << 60)) return std::nullopt;  // v1's "unlimited" is LONG_MAX rounded to pages
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<uint64_t> read_number(const std::string& path) {
  const std::string line = read_first_line(path);
  if (line.empty()) return std::nullopt;
  try {
    return std::stoull(line);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The tightest limit on the path from the cgroup `relative` up to `root` (a parent's limit binds its children).
std::optional<uint64_t> tightest_limit(const std::string& root, std::string relative, const char* file,
                                       uint64_t* usage, const char* usage_file) {
  std::optional<uint64_t> best;
  bool usage_read = false;
  while (true) {
    const std::string dir = root + (relative == "/" ? "" : relative);
    if (auto l = read_limit(dir + "/" + file)) {
      if (!best || *l < *best) best = l;
    }
    if (!usage_read) {
      if (auto u = read_number(dir + "/" + usage_file)) {
        *usage = *u;
        usage_read = true;
      }
    }
    if (relative.empty() || relative == "/") break;
    const size_t slash = relative.find_last_of('/');
    relative = slash == 0 || slash == std::string::npos ? "/" : relative.substr(0, slash);
  }
  return best;
}

bool is_dir(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

}  // namespace

Topology probe_topology() {
  Topology t;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return t;
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return t;
  }
  t.packages = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE));
  t.numa_nodes = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE));
  t.cores = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
  t.threads = std::max(t.cores, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
  const hwloc_obj_type_t levels[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE};
  for (int i = 0; i < 3; ++i) {
    const int n = hwloc_get_nbobjs_by_type(topo, levels[i]);
    if (n <= 0) continue;
    hwloc_obj_t obj = hwloc_get_obj_by_type(topo, levels[i], 0);
    if (obj->attr && obj->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION) continue;
    CacheLevel level{i + 1, uint64_t(obj->attr ? obj->attr->cache.size : 0), n};
    // A VM may see its host's whole L3 for the two cores it has (one VM here: 508 MiB); probes sized by it would
    // stream gigabytes.
    const int sharing = std::max(1, hwloc_get_nbobjs_inside_cpuset_by_type(topo, obj->cpuset, HWLOC_OBJ_CORE));
    const std::string clamped = clamp_cache_level(level, sharing);
    if (!clamped.empty()) spdlog::info("[calibrate] {}", clamped);
    t.caches.push_back(level);
  }
  if (hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0))
    if (const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel")) t.cpu_model = model;
  hwloc_topology_destroy(topo);
  // The same families the kernels dispatch on (runtime/kernels keeps its own detection private).
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni"))
    t.isa = "avx512";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    t.isa = "avx2";
  else
    t.isa = "scalar";
  return t;
}

MemoryInfo probe_memory(const SystemPaths& paths) {
  MemoryInfo m;
  std::ifstream meminfo(paths.proc_meminfo);
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream s(line);
    std::string key, unit;
    uint64_t value = 0;
    if (!(s >> key >> value)) continue;
    s >> unit;
    const uint64_t bytes = unit == "kB" ? value * 1024 : value;
    if (key == "MemTotal:") m.total = bytes;
    else if (key == "MemAvailable:") m.available = bytes;
    else if (key == "HugePages_Total:") m.hugepages_total = value;
    else if (key == "HugePages_Free:") m.hugepages_free = value;
    else if (key == "Hugepagesize:") m.hugepage_bytes = bytes;
  }
  // /proc/self/cgroup: "ID:controllers:path"; v1 names "memory" among the controllers, v2 is "0::path".
  std::ifstream cgroups(paths.proc_self_cgroup);
  while (std::getline(cgroups, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::istringstream list(controllers);
    bool memory = false;
    for (std::string c; std::getline(list, c, ',');) memory |= c == "memory";
    if (memory) {
      m.cgroup_v1_limit = tightest_limit(paths.cgroup_root + "/memory", path, "memory.limit_in_bytes",
                                         &m.cgroup_usage, "memory.usage_in_bytes");
    } else if (controllers.empty() && line.rfind("0:", 0) == 0) {
      // Unified hierarchy: at the root (pure v2) or under unified/ (hybrid).
      const std::string root = is_dir(paths.cgroup_root + "/cgroup.controllers") ? paths.cgroup_root
                                                                                  : paths.cgroup_root + "/unified";
      uint64_t usage = 0;
      m.cgroup_v2_limit = tightest_limit(root, path, "memory.max", &usage, "memory.current");
      if (m.cgroup_v2_limit && !m.cgroup_v1_limit) m.cgroup_usage = usage;
    }
  }
  const std::string thp = read_first_line(paths.thp_enabled);
  const size_t open = thp.find('['), close = thp.find(']');
  if (open != std::string::npos && close > open) m.transparent_hugepages = thp.substr(open + 1, close - open - 1);
  return m;
}

GpuInfo probe_gpu(const ProbeOptions& options) {
  GpuInfo g;
  if (!gpu::gpu_available()) {
    g.reason = gpu::gpu_unavailable_reason();
    if (g.reason.empty()) g.reason = "no usable GPU";
    return g;
  }
  try {
    const std::optional<gpu::GpuProbe> probe = gpu::probe_gpu(options.quick);
    if (!probe) {
      g.reason = "GPU probe returned nothing: " + gpu::gpu_unavailable_reason();
      return g;
    }
    g.present = true;
    g.name = probe->name;
    g.memory = probe->total_bytes;
    g.free_memory = probe->free_bytes;
    g.h2d_gbs = probe->h2d_pinned_bytes_per_second / 1e9;
    g.memory_gbs = probe->d2d_bytes_per_second / 1e9;
  } catch (const std::exception& e) {  // a broken driver must not stop calibration: plan for the CPU, say why
    g = GpuInfo{};
    g.reason = std::string("GPU probe failed: ") + e.what();
  }
  return g;
}

DeviceProfile probe_device_identity(const std::string& storage_dir) {
  DeviceProfile p;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) p.hostname = host;
  p.topology = probe_topology();
  p.memory = probe_memory();
  p.storage = probe_storage_identity(storage_dir);
  ProbeOptions quick;
  quick.quick = true;
  p.gpu = probe_gpu(quick);  // the name is part of the fingerprint
  return p;
}

}  // namespace tierlm::calibrate
