#include "server/process_stats.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace tierlm::server {

namespace fs = std::filesystem;

namespace {
std::optional<std::string> first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<uint64_t> number_file(const fs::path& p) {
  auto line = first_line(p);
  if (!line) return std::nullopt;
  try {
    size_t used = 0;
    const uint64_t v = std::stoull(*line, &used);
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

// The cgroup's own directory if it is visible, else the mount root (inside a container's cgroup namespace the
// path is often "/" or not mounted under its host name).
fs::path pick_dir(const fs::path& base, const std::string& rel, const char* file) {
  fs::path dir = base / fs::path(rel).relative_path();
  std::error_code ec;
  if (fs::exists(dir / file, ec)) return dir;
  return base;
}
}  // namespace

std::optional<uint64_t> resident_set_bytes(const fs::path& statm) {
  std::ifstream in(statm);
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return std::nullopt;
  return resident_pages * uint64_t(sysconf(_SC_PAGESIZE));
}

std::optional<uint64_t> peak_resident_set_bytes(const fs::path& status) {
  std::ifstream in(status);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream value(line.substr(6));
      uint64_t kib = 0;
      if (value >> kib) return kib * 1024;
      return std::nullopt;
    }
  return std::nullopt;
}

CgroupMemory cgroup_memory(const fs::path& proc_cgroup, const fs::path& root) {
  CgroupMemory out;
  std::ifstream in(proc_cgroup);
  std::string line, v1_path, v2_path;
  bool have_v1 = false, have_v2 = false;
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      have_v2 = true;
      v2_path = path;
    }
    std::stringstream ss(controllers);
    std::string c;
    while (std::getline(ss, c, ','))
      if (c == "memory") {
        have_v1 = true;
        v1_path = path;
      }
  }
  std::error_code ec;
  // v2 first when its memory controller is really there (a hybrid host lists "0::/" without one).
  if (have_v2) {
    const fs::path base = fs::exists(root / "unified", ec) && !fs::exists(root / "memory.max", ec) ? root / "unified" : root;
    const fs::path dir = pick_dir(base, v2_path, "memory.max");
    if (auto max = first_line(dir / "memory.max")) {
      out.version = 2;
      out.path = dir.string();
      if (*max != "max") out.limit_bytes = number_file(dir / "memory.max");
      out.usage_bytes = number_file(dir / "memory.current");
      return out;
    }
  }
  if (have_v1) {
    const fs::path dir = pick_dir(root / "memory", v1_path, "memory.limit_in_bytes");
    if (auto limit = number_file(dir / "memory.limit_in_bytes")) {
      out.version = 1;
      out.path = dir.string();
      // v1 reports "no limit" as a huge page-aligned number near 2^63.
      if (*limit < (uint64_t(1) << 62)) out.limit_bytes = *limit;
      out.usage_bytes = number_file(dir / "memory.usage_in_bytes");
    }
  }
  return out;
}

}  // namespace tierlm::server
