// calibrate/storage_probe.cpp — which device holds the model's filesystem, and how fast it serves the reads the
// ExpertReader will issue: O_DIRECT random reads through io_uring over a sweep of block sizes and queue depths, on
// a scratch file created (and always removed) in that directory.
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "calibrate/probes.h"
#include "tiering/ledger.h"

namespace tierlm::calibrate {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// Closes a descriptor and unlinks the scratch file however the probe ends.
struct ScratchFile {
  std::string path;
  int fd = -1;
  ~ScratchFile() {
    if (fd >= 0) close(fd);
    if (!path.empty()) unlink(path.c_str());
  }
};

struct Ring {
  io_uring ring{};
  bool ok = false;
  explicit Ring(unsigned entries) { ok = io_uring_queue_init(entries, &ring, 0) == 0; }
  ~Ring() {
    if (ok) io_uring_queue_exit(&ring);
  }
};

uint64_t next_random(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

// Creates `bytes` of non-trivial data at `path`, flushed to the device and dropped from the page cache every
// kScratchFlushBytes, so its dirty pages (which a memory cgroup charges) never exceed that.
constexpr uint64_t kScratchFlushBytes = 8ull << 20;
void write_scratch(const std::string& path, uint64_t bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("storage probe: cannot create scratch file " + path + ": " + std::strerror(errno));
  std::vector<uint64_t> chunk((4u << 20) / 8);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (auto& v : chunk) v = next_random(state);
  for (uint64_t written = 0; written < bytes;) {
    const size_t n = size_t(std::min<uint64_t>(chunk.size() * 8, bytes - written));
    const ssize_t w = write(fd, chunk.data(), n);
    if (w <= 0) {
      const std::string err = std::strerror(errno);
      close(fd);
      throw std::runtime_error("storage probe: cannot write scratch file " + path + ": " + err);
    }
    written += uint64_t(w);
    chunk[written % chunk.size()] ^= written;  // no two 4 MiB chunks alike (no dedup/compression shortcut)
    if (written % kScratchFlushBytes == 0) {
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
  }
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// One cell of the sweep: random block-aligned reads, `depth` in flight, for `seconds`, with the CPU time this
// thread spent per read.
StorageSample time_burst(int fd, Ring* ring, char* buffers, uint64_t file_bytes, uint64_t block, unsigned depth,
                         double seconds, uint64_t seed) {
  StorageSample sample;
  sample.block_size = block;
  sample.queue_depth = depth;
  const uint64_t blocks = std::max<uint64_t>(file_bytes / block, 1);
  uint64_t state = 0x2545F4914F6CDD1Dull ^ (block * 131 + depth) ^ (seed * 0x9E3779B97F4A7C15ull);
  uint64_t bytes = 0, reads = 0;
  const double cpu_start = thread_cpu_seconds();
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  if (ring && ring->ok) {
    unsigned in_flight = 0;
    auto submit = [&](unsigned slot) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
      io_uring_prep_read(sqe, fd, buffers + uint64_t(slot) * block, unsigned(block),
                         (next_random(state) % blocks) * block);
      io_uring_sqe_set_data64(sqe, slot);
      ++in_flight;
    };
    for (unsigned i = 0; i < depth; ++i) submit(i);
    io_uring_submit(&ring->ring);
    bool stopping = false;
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring->ring, &cqe) != 0) break;
      const int res = cqe->res;
      const unsigned slot = unsigned(io_uring_cqe_get_data64(cqe));
      io_uring_cqe_seen(&ring->ring, cqe);
      --in_flight;
      if (res < 0) throw std::runtime_error(std::string("storage probe: read failed: ") + std::strerror(-res));
      bytes += uint64_t(res);
      ++reads;
      if (!stopping && Clock::now() >= deadline) stopping = true;
      if (!stopping) {
        submit(slot);
        io_uring_submit(&ring->ring);
      }
    }
  } else {
    while (Clock::now() < deadline) {
      const ssize_t r = pread(fd, buffers, block, off_t((next_random(state) % blocks) * block));
      if (r < 0) throw std::runtime_error(std::string("storage probe: read failed: ") + std::strerror(errno));
      bytes += uint64_t(r);
      ++reads;
    }
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  sample.gbs = double(bytes) / elapsed / 1e9;
  sample.iops = double(reads) / elapsed;
  if (reads > 0) sample.cpu_seconds_per_read = (thread_cpu_seconds() - cpu_start) / double(reads);
  return sample;
}

// One cell: kStorageBursts bursts of seconds / kStorageBursts each, the median burst's rates. A virtual disk's one
// burst of a quick sweep (0.28 s) read 1 MiB blocks at 1.1-2.2 GB/s from one run to the next, a minute apart, where
// the tier's decode moved 15% (fit_accuracy_bench on the device's Xeon).
constexpr int kStorageBursts = 5;
StorageSample time_reads(int fd, Ring* ring, char* buffers, uint64_t file_bytes, uint64_t block, unsigned depth,
                         double seconds) {
  std::vector<StorageSample> bursts;
  for (int b = 0; b < kStorageBursts; ++b)
    bursts.push_back(time_burst(fd, ring, buffers, file_bytes, block, depth, seconds / kStorageBursts, uint64_t(b)));
  std::sort(bursts.begin(), bursts.end(), [](const StorageSample& a, const StorageSample& b) { return a.gbs < b.gbs; });
  return bursts[bursts.size() / 2];
}

}  // namespace

std::string largest_model_file(const std::string& model_dir) {
  if (model_dir.empty()) return "";
  std::string best;
  uint64_t best_bytes = 0;
  for (const fs::path& f : model_weight_files(model_dir)) {
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) continue;
    const uint64_t bytes = fs::file_size(f, ec);
    if (!ec && bytes > best_bytes) best = f.string(), best_bytes = bytes;
  }
  return best;
}

StorageInfo probe_storage_identity(const std::string& dir) {
  StorageInfo info;
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(fs::absolute(dir), ec);
  info.path = ec ? dir : real.string();
  struct stat st {};
  if (stat(info.path.c_str(), &st) != 0) return info;
  const unsigned major_id = major(st.st_dev), minor_id = minor(st.st_dev);
  // /proc/self/mountinfo: "id parent major:minor root mountpoint opts ... - fstype source superopts"; the longest
  // mount point above the directory on the same device names the filesystem.
  std::ifstream mounts("/proc/self/mountinfo");
  size_t best = 0;
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream s(line);
    std::string id, parent, devno, root, mountpoint;
    s >> id >> parent >> devno >> root >> mountpoint;
    if (devno != std::to_string(major_id) + ":" + std::to_string(minor_id)) continue;
    if (info.path.rfind(mountpoint, 0) != 0 || mountpoint.size() < best) continue;
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    tail >> info.filesystem;
    best = mountpoint.size();
  }
  // /sys/dev/block/M:m is the device (or a partition, whose queue/ is its parent's).
  const std::string sys = "/sys/dev/block/" + std::to_string(major_id) + ":" + std::to_string(minor_id);
  const fs::path target = fs::canonical(sys, ec);
  if (!ec) {
    info.device = target.filename().string();
    std::string rotational = read_first_line(target.string() + "/queue/rotational");
    if (rotational.empty()) rotational = read_first_line(target.parent_path().string() + "/queue/rotational");
    info.rotational = rotational == "1";
  }
  return info;
}

StorageInfo probe_storage(const ProbeOptions& options) {
  StorageInfo info = probe_storage_identity(options.storage_dir);
  const std::vector<uint64_t> blocks = options.quick
      ? std::vector<uint64_t>{4096, 64 << 10, 1 << 20}
      : std::vector<uint64_t>{4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
  const std::vector<unsigned> depths = options.quick ? std::vector<unsigned>{1, 8, 32}
                                                     : std::vector<unsigned>{1, 4, 16, 32, 64};
  uint64_t file_bytes = options.quick ? (64ull << 20) : (256ull << 20);
  const size_t total = blocks.size() * depths.size() + 1;
  auto progress = [&](size_t done) {
    if (options.progress) options.progress("storage", done, total);
  };
  progress(0);

  ScratchFile scratch;
  std::string target;
  {
    std::error_code ec;
    const uint64_t own = options.storage_file.empty() ? 0 : uint64_t(fs::file_size(options.storage_file, ec));
    if (!ec && own >= kStorageFileMinBytes) {
      // The model's own file, read in place: nothing written, nothing removed.
      target = options.storage_file;
      file_bytes = own;
      info.file = target;
    } else {
      scratch.path = (fs::path(info.path) / (".tierlm-calibrate-" + std::to_string(getpid()) + ".tmp")).string();
      write_scratch(scratch.path, file_bytes);
      target = scratch.path;
    }
  }
  progress(1);

  scratch.fd = open(target.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  info.direct_io = scratch.fd >= 0;
  if (!info.direct_io) {
    info.warning = std::string("O_DIRECT refused on ") + (info.filesystem.empty() ? "this filesystem" : info.filesystem) +
                   " (" + std::strerror(errno) + "): measured buffered reads, which the page cache may flatter";
    spdlog::warn("calibrate: {}", info.warning);
    scratch.fd = open(target.c_str(), O_RDONLY | O_CLOEXEC);
    if (scratch.fd < 0)
      throw std::runtime_error("storage probe: cannot open " + target + ": " + std::strerror(errno));
  }
  const unsigned max_depth = *std::max_element(depths.begin(), depths.end());
  Ring ring(max_depth);
  info.io_uring = ring.ok;
  if (!ring.ok) {
    const std::string msg = "io_uring unavailable: measured synchronous pread (queue depth 1 only)";
    info.warning += (info.warning.empty() ? "" : "; ") + msg;
    spdlog::warn("calibrate: {}", msg);
  }
  tiering::Ledger ledger;
  const uint64_t max_block = *std::max_element(blocks.begin(), blocks.end());
  // Read buffers for the deepest queue of the largest block, within half the probes' memory budget; cells that
  // would need more are left out (the planner takes the nearest measured one).
  uint64_t buffer_bytes = max_block * max_depth;
  if (options.memory_budget) buffer_bytes = std::max<uint64_t>(std::min(buffer_bytes, options.memory_budget / 2), max_block);
  tiering::LedgerBuffer buffers(ledger, tiering::accounts::scratch, size_t(buffer_bytes), 4096);
  const double cell_seconds = options.seconds_per_probe / double(blocks.size() * depths.size());
  size_t done = 1;
  for (uint64_t block : blocks)
    for (unsigned depth : depths) {
      if (block * (ring.ok ? depth : 1) > buffer_bytes) {
        spdlog::info("[calibrate] storage probe: {} KiB reads at queue depth {} left out ({} KiB of buffers is over "
                     "the probes' memory budget)", block / 1024, depth, block * depth / 1024);
        progress(++done);
        continue;
      }
      info.sweep.push_back(time_reads(scratch.fd, ring.ok ? &ring : nullptr, buffers.as<char>(), file_bytes, block,
                                      ring.ok ? depth : 1, cell_seconds));
      info.sweep.back().queue_depth = depth;
      progress(++done);
    }
  return info;
}

}  // namespace tierlm::calibrate
