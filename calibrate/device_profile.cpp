// calibrate/device_profile.cpp — DeviceProfile's JSON form and fingerprint.
#include "calibrate/device_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "calibrate/json_fields.h"

namespace tierlm::calibrate {

namespace bj = boost::json;

uint64_t MemoryInfo::limit() const {
  uint64_t l = total;
  if (cgroup_v1_limit) l = std::min(l, *cgroup_v1_limit);
  if (cgroup_v2_limit) l = std::min(l, *cgroup_v2_limit);
  return l;
}

uint64_t MemoryInfo::usable() const {
  const uint64_t l = limit();
  uint64_t u = available ? std::min(available, l) : l;
  if ((cgroup_v1_limit || cgroup_v2_limit) && l < total) u = std::min(u, l > cgroup_usage ? l - cgroup_usage : 0);
  return u;
}

double StorageInfo::best_gbs() const {
  double best = 0;
  for (auto& s : sweep) best = std::max(best, s.gbs);
  return best;
}

double StorageInfo::iops_4k() const {
  double best = 0;
  for (auto& s : sweep)
    if (s.block_size == 4096) best = std::max(best, s.iops);
  return best;
}

const StorageSample* StorageInfo::find(uint64_t block, unsigned depth) const {
  for (auto& s : sweep)
    if (s.block_size == block && s.queue_depth == depth) return &s;
  return nullptr;
}

std::string fingerprint_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", (unsigned long long)h);
  return out;
}

namespace {
uint64_t round_gib(uint64_t bytes) { return uint64_t(std::llround(double(bytes) / double(1ull << 30))); }
}  // namespace

std::string DeviceProfile::identity() const {
  std::ostringstream s;
  s << (topology.cpu_model.empty() ? "unknown CPU" : topology.cpu_model) << ", " << topology.packages
    << " package(s), " << topology.cores << " cores/" << topology.threads << " threads, " << topology.numa_nodes
    << " NUMA node(s), " << round_gib(memory.total) << " GiB RAM";
  if (memory.limit() < memory.total) s << " (cgroup limit " << round_gib(memory.limit()) << " GiB)";
  s << ", storage " << (storage.device.empty() ? "?" : storage.device) << "/" << storage.filesystem
    << (storage.rotational ? " rotational" : "");
  s << ", GPU " << (gpu.present ? gpu.name : "none");
  return s.str();
}

std::string DeviceProfile::fingerprint() const { return fingerprint_hash(identity()); }

double DeviceProfile::read_gbs() const {
  double best = 0;
  for (auto& b : bandwidth) best = std::max(best, b.read_gbs);
  return best;
}

bj::value to_json(const DeviceProfile& p) {
  bj::object o;
  o["schema_version"] = DeviceProfile::kSchemaVersion;
  o["fingerprint"] = p.fingerprint();
  o["identity"] = p.identity();
  o["hostname"] = p.hostname;
  o["measured_at"] = p.measured_at;
  o["quick"] = p.quick;
  o["probe_seconds"] = p.probe_seconds;
  bj::array caches;
  for (auto& c : p.topology.caches) caches.push_back(bj::object{{"level", c.level}, {"bytes", c.bytes}, {"instances", c.instances}});
  o["topology"] = bj::object{{"cpu_model", p.topology.cpu_model}, {"packages", p.topology.packages},
                             {"numa_nodes", p.topology.numa_nodes}, {"cores", p.topology.cores},
                             {"threads", p.topology.threads}, {"caches", caches}, {"isa", p.topology.isa}};
  const auto& m = p.memory;
  bj::object mem{{"total", m.total},
                 {"available", m.available},
                 {"cgroup_usage", m.cgroup_usage},
                 {"hugepage_bytes", m.hugepage_bytes},
                 {"hugepages_total", m.hugepages_total},
                 {"hugepages_free", m.hugepages_free},
                 {"transparent_hugepages", m.transparent_hugepages},
                 {"limit", m.limit()},
                 {"usable", m.usable()}};
  mem["cgroup_v1_limit"] = m.cgroup_v1_limit ? bj::value(*m.cgroup_v1_limit) : bj::value(nullptr);
  mem["cgroup_v2_limit"] = m.cgroup_v2_limit ? bj::value(*m.cgroup_v2_limit) : bj::value(nullptr);
  o["memory"] = mem;
  const auto& s = p.storage;
  bj::array sweep;
  for (auto& x : s.sweep)
    sweep.push_back(bj::object{{"block_size", x.block_size}, {"queue_depth", x.queue_depth}, {"gbs", x.gbs},
                               {"iops", x.iops}, {"cpu_seconds_per_read", x.cpu_seconds_per_read}});
  o["storage"] = bj::object{{"path", s.path},         {"device", s.device},     {"filesystem", s.filesystem},
                            {"rotational", s.rotational}, {"direct_io", s.direct_io}, {"io_uring", s.io_uring},
                            {"warning", s.warning},   {"file", s.file},         {"sweep", sweep}};
  bj::array bw;
  for (auto& b : p.bandwidth)
    bw.push_back(bj::object{{"node", b.node}, {"threads", b.threads}, {"read_gbs", b.read_gbs}, {"copy_gbs", b.copy_gbs}, {"triad_gbs", b.triad_gbs}});
  o["bandwidth"] = bw;
  bj::array compute;
  for (auto& c : p.compute) {
    bj::object matmul, matmul16, experts;
    for (auto& [format, gflops] : c.matmul_gflops) matmul[format] = gflops;
    for (auto& [format, gflops] : c.matmul16_gflops) matmul16[format] = gflops;
    for (auto& [format, gflops] : c.expert_gemm_gflops) experts[format] = gflops;
    compute.push_back(bj::object{{"threads", c.threads}, {"sgemm_gflops", c.sgemm_gflops}, {"matvec_q8_gbs", c.matvec_q8_gbs}, {"matvec_q4_gbs", c.matvec_q4_gbs},
                                 {"matvec_f16_gbs", c.matvec_f16_gbs}, {"matvec_bf16_gbs", c.matvec_bf16_gbs},
                                 {"matvec_f32_gbs", c.matvec_f32_gbs},
                                 {"matmul_gflops", matmul}, {"matmul16_gflops", matmul16},
                                 {"expert_gemm_gflops", experts}});
  }
  o["compute"] = compute;
  o["gpu"] = bj::object{{"present", p.gpu.present}, {"reason", p.gpu.reason},       {"name", p.gpu.name},
                        {"memory", p.gpu.memory}, {"free_memory", p.gpu.free_memory},   {"h2d_gbs", p.gpu.h2d_gbs},     {"memory_gbs", p.gpu.memory_gbs}};
  return o;
}

namespace {
std::optional<uint64_t> optional_bytes(const bj::object& o, const char* name, const std::string& what) {
  const bj::value* v = o.if_contains(name);
  if (!v || v->is_null()) return std::nullopt;
  return json::unsigned_integer(o, name, what);
}
}  // namespace

DeviceProfile device_profile_from_json(const bj::value& v) {
  using namespace json;
  const std::string what = "device profile";
  const auto& o = object(v, what);
  const int64_t version = integer(o, "schema_version", what);
  if (version != DeviceProfile::kSchemaVersion)
    throw std::runtime_error(what + ": schema_version " + std::to_string(version) + " is not the supported " +
                             std::to_string(DeviceProfile::kSchemaVersion) + " (re-run tierlm calibrate)");
  DeviceProfile p;
  p.hostname = string_or(o, "hostname", "");
  p.measured_at = string_or(o, "measured_at", "");
  if (o.contains("quick")) p.quick = boolean(o, "quick", what);
  if (o.contains("probe_seconds")) p.probe_seconds = number(o, "probe_seconds", what);
  const auto& t = object(field(o, "topology", what), what + ".topology");
  const std::string tw = what + ".topology";
  p.topology.cpu_model = string_or(t, "cpu_model", "");
  p.topology.packages = int(integer(t, "packages", tw));
  p.topology.numa_nodes = int(integer(t, "numa_nodes", tw));
  p.topology.cores = int(integer(t, "cores", tw));
  p.topology.threads = int(integer(t, "threads", tw));
  p.topology.isa = string_or(t, "isa", "scalar");
  if (t.contains("caches"))
    for (auto& c : array(t, "caches", tw)) {
      const auto& co = object(c, tw + ".caches[]");
      p.topology.caches.push_back({int(integer(co, "level", tw)), unsigned_integer(co, "bytes", tw),
                                   int(integer(co, "instances", tw))});
    }
  const std::string mw = what + ".memory";
  const auto& m = object(field(o, "memory", what), mw);
  p.memory.total = unsigned_integer(m, "total", mw);
  p.memory.available = unsigned_integer(m, "available", mw);
  p.memory.cgroup_v1_limit = optional_bytes(m, "cgroup_v1_limit", mw);
  p.memory.cgroup_v2_limit = optional_bytes(m, "cgroup_v2_limit", mw);
  if (m.contains("cgroup_usage")) p.memory.cgroup_usage = unsigned_integer(m, "cgroup_usage", mw);
  if (m.contains("hugepage_bytes")) p.memory.hugepage_bytes = unsigned_integer(m, "hugepage_bytes", mw);
  if (m.contains("hugepages_total")) p.memory.hugepages_total = unsigned_integer(m, "hugepages_total", mw);
  if (m.contains("hugepages_free")) p.memory.hugepages_free = unsigned_integer(m, "hugepages_free", mw);
  p.memory.transparent_hugepages = string_or(m, "transparent_hugepages", "");
  const std::string sw = what + ".storage";
  const auto& s = object(field(o, "storage", what), sw);
  p.storage.path = string_or(s, "path", "");
  p.storage.device = string_or(s, "device", "");
  p.storage.filesystem = string_or(s, "filesystem", "");
  p.storage.rotational = boolean(s, "rotational", sw);
  p.storage.direct_io = boolean(s, "direct_io", sw);
  if (s.contains("io_uring")) p.storage.io_uring = boolean(s, "io_uring", sw);
  p.storage.warning = string_or(s, "warning", "");
  p.storage.file = string_or(s, "file", "");
  for (auto& x : array(s, "sweep", sw)) {
    const auto& xo = object(x, sw + ".sweep[]");
    p.storage.sweep.push_back({unsigned_integer(xo, "block_size", sw), unsigned(integer(xo, "queue_depth", sw)),
                               number(xo, "gbs", sw), number(xo, "iops", sw),
                               xo.contains("cpu_seconds_per_read") ? number(xo, "cpu_seconds_per_read", sw) : 0.0});
  }
  const std::string bw = what + ".bandwidth";
  for (auto& x : array(o, "bandwidth", what)) {
    const auto& xo = object(x, bw + "[]");
    p.bandwidth.push_back({int(integer(xo, "node", bw)), int(integer(xo, "threads", bw)), number(xo, "read_gbs", bw),
                           number(xo, "copy_gbs", bw), number(xo, "triad_gbs", bw)});
  }
  const std::string cw = what + ".compute";
  for (auto& x : array(o, "compute", what)) {
    const auto& xo = object(x, cw + "[]");
    ComputeSample s;
    s.threads = int(integer(xo, "threads", cw));
    s.sgemm_gflops = number(xo, "sgemm_gflops", cw);
    s.matvec_q8_gbs = number(xo, "matvec_q8_gbs", cw);
    s.matvec_q4_gbs = number(xo, "matvec_q4_gbs", cw);
    // Optional: profiles written before the dense-format probes lack them (the planner falls back to q8's rate).
    if (xo.contains("matvec_f16_gbs")) s.matvec_f16_gbs = number(xo, "matvec_f16_gbs", cw);
    if (xo.contains("matvec_bf16_gbs")) s.matvec_bf16_gbs = number(xo, "matvec_bf16_gbs", cw);
    if (xo.contains("matvec_f32_gbs")) s.matvec_f32_gbs = number(xo, "matvec_f32_gbs", cw);
    for (auto [name, rates] : {std::pair{"matmul_gflops", &s.matmul_gflops}, std::pair{"matmul16_gflops", &s.matmul16_gflops},
                               std::pair{"expert_gemm_gflops", &s.expert_gemm_gflops}})
      if (const bj::value* mm = xo.if_contains(name))  // optional too: profiles before the GEMM / expert probes
        for (auto& [format, gflops] : object(*mm, cw + "." + name))
          (*rates)[std::string(format)] = number_value(gflops, cw + "." + name);
    p.compute.push_back(s);
  }
  if (const bj::value* g = o.if_contains("gpu")) {
    const std::string gw = what + ".gpu";
    const auto& go = object(*g, gw);
    p.gpu.present = boolean(go, "present", gw);
    p.gpu.reason = string_or(go, "reason", "");
    p.gpu.name = string_or(go, "name", "");
    if (go.contains("memory")) p.gpu.memory = unsigned_integer(go, "memory", gw);
    if (go.contains("free_memory")) p.gpu.free_memory = unsigned_integer(go, "free_memory", gw);
    if (go.contains("h2d_gbs")) p.gpu.h2d_gbs = number(go, "h2d_gbs", gw);
    if (go.contains("memory_gbs")) p.gpu.memory_gbs = number(go, "memory_gbs", gw);
  }
  if (p.topology.cores < 1 || p.topology.threads < p.topology.cores || p.topology.numa_nodes < 1 ||
      p.topology.packages < 1)
    throw std::runtime_error(what + ": topology counts must be positive and threads >= cores");
  if (p.memory.total == 0) throw std::runtime_error(what + ": memory.total must be positive");
  return p;
}

DeviceProfile load_device_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open device profile " + path);
  std::stringstream text;
  text << in.rdbuf();
  boost::system::error_code ec;
  bj::value v = bj::parse(text.str(), ec);
  if (ec) throw std::runtime_error("device profile " + path + ": invalid JSON: " + ec.message());
  try {
    return device_profile_from_json(v);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace tierlm::calibrate
