// calibrate/wisdom.cpp — reading, writing (atomic, under an flock) and looking up the wisdom file.
#include "calibrate/wisdom.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "calibrate/json_fields.h"

namespace tierlm::calibrate {

namespace bj = boost::json;
namespace fs = std::filesystem;

namespace {
std::string absolute_path(const fs::path& p) {
  std::error_code ec;
  fs::path a = fs::weakly_canonical(fs::absolute(p), ec);
  return (ec ? fs::absolute(p) : a).lexically_normal().string();
}

// Wisdom files are tens of KB per entry; anything this large is not one, and is not read into memory.
constexpr uint64_t kMaxWisdomBytes = 64ull << 20;
// A writer holds the lock for milliseconds (read, merge, write); waiting this long means one is stuck.
constexpr auto kLockTimeout = std::chrono::seconds(60);

std::string errno_text(int err) { return std::strerror(err); }

fs::path sibling(const fs::path& path, const std::string& suffix) { return fs::path(path.string() + suffix); }
std::string temp_prefix(const fs::path& path) { return path.filename().string() + ".tmp."; }

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename is done; only its durability across a power cut is at stake
  ::fsync(fd);
  ::close(fd);
}

// flock on PATH.lock: excludes other writers (processes, or threads through their own descriptors) for its lifetime.
// The lock file stays: removing it would let two writers lock two different files.
class WriterLock {
 public:
  explicit WriterLock(const fs::path& wisdom_path) : path_(sibling(wisdom_path, ".lock")) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int err = errno;
      throw WisdomError(fmt::format("cannot open the wisdom lock file {}: {}", path_.string(), errno_text(err)));
    }
    const auto deadline = std::chrono::steady_clock::now() + kLockTimeout;
    auto pause = std::chrono::milliseconds(1);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK && err != EINTR) {
        ::close(fd_);
        throw WisdomError(fmt::format("cannot lock {}: {}", path_.string(), errno_text(err)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::close(fd_);
        throw WisdomError(fmt::format("another tierlm has held the wisdom lock {} for over {} s; is a calibration "
                                      "stuck? (stop it, or pass --wisdom PATH)",
                                      path_.string(), kLockTimeout.count()));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }
  ~WriterLock() { ::close(fd_); }  // closing the last descriptor releases the flock
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  fs::path path_;
  int fd_ = -1;
};

// Unique within the directory across processes and threads; O_EXCL makes a collision an error, not a shared file.
fs::path temp_path(const fs::path& path) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 random{std::random_device{}()};
  return path.parent_path() / fmt::format("{}{}.{}.{:016x}", temp_prefix(path), ::getpid(), counter++, random());
}

// Temporary files left by writers killed mid-write. Called under the lock: no live writer has one then.
void remove_stale_temps(const fs::path& path) {
  std::error_code ec;
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const std::string prefix = temp_prefix(path);
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
}

void write_all(int fd, const std::string& text, const fs::path& tmp) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw WisdomError(fmt::format("cannot write {}: {}", tmp.string(), errno_text(n < 0 ? errno : EIO)));
    done += size_t(n);
  }
}

// Temporary file, write, fsync, rename over the target, fsync the directory. The caller holds the lock.
void write_atomically(const fs::path& path, const Wisdom& w) {
  const std::string text = bj::serialize(to_json(w)) + "\n";
  const fs::path tmp = temp_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw WisdomError(fmt::format("cannot create {}: {}", tmp.string(), errno_text(err)));
  }
  bool open = true;  // a second close could hit a descriptor another thread has opened since
  try {
    write_all(fd, text, tmp);
    if (::fsync(fd) != 0) throw WisdomError(fmt::format("cannot fsync {}: {}", tmp.string(), errno_text(errno)));
    open = false;  // released even when close reports an error
    if (::close(fd) != 0) throw WisdomError(fmt::format("cannot close {}: {}", tmp.string(), errno_text(errno)));
  } catch (...) {
    if (open) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw WisdomError(fmt::format("cannot replace wisdom file {}: {}", path.string(), errno_text(err)));
  }
  fsync_directory(path.parent_path());
}

void create_parent(const fs::path& path) {
  if (!path.has_parent_path()) return;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec)
    throw WisdomError(
        fmt::format("cannot create the wisdom directory {}: {}", path.parent_path().string(), ec.message()));
}

// PATH.corrupt-20260101T120000Z (then -2, -3, ... when taken).
fs::path move_aside(const fs::path& path) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  fs::path aside = sibling(path, std::string(".corrupt-") + stamp);
  std::error_code ec;
  for (int n = 2; fs::exists(fs::symlink_status(aside, ec)); ++n)
    aside = sibling(path, fmt::format(".corrupt-{}-{}", stamp, n));
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    const int err = errno;
    throw WisdomError(fmt::format("wisdom file {} is corrupt and cannot be moved aside to {}: {}; delete it",
                                  path.string(), aside.string(), errno_text(err)));
  }
  fsync_directory(path.parent_path());
  return aside;
}

// What is wrong with text as JSON, or "" when it parses (into out).
std::string parse_problem(const std::string& text, bj::value& out) {
  if (text.empty()) return "the file is empty (0 bytes)";
  // JSON allows no raw control characters but tab, newline and carriage return (strings escape the rest).
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
      return fmt::format("binary data, not JSON (byte 0x{:02x} at offset {} of {})", unsigned(c), i, text.size());
  }
  bj::stream_parser parser;
  boost::system::error_code ec;
  const size_t consumed = parser.write(text.data(), text.size(), ec);
  if (!ec) parser.finish(ec);
  if (ec == bj::error::incomplete)
    return fmt::format("truncated JSON: the document ends unfinished after {} bytes", text.size());
  if (ec) return fmt::format("not valid JSON: {} at byte {} of {}", ec.message(), consumed, text.size());
  out = parser.release();
  return "";
}
}  // namespace

CorruptWisdomError::CorruptWisdomError(const fs::path& path, const std::string& problem, const fs::path& model_dir)
    : WisdomError(fmt::format("wisdom file {} is corrupt: {}; run `{}` to rebuild it (the corrupt file is kept as "
                              "{}.corrupt-<time>), or delete {}",
                              path.string(), problem, recalibrate_command(path, model_dir), path.string(),
                              path.string())),
      path_(path),
      problem_(problem) {}

void Wisdom::upsert(WisdomEntry entry) {
  const std::string fp = entry.plan.device_fingerprint;
  for (auto& e : entries)
    if (e.plan.device_fingerprint == fp && e.model.path == entry.model.path) {
      e = std::move(entry);
      return;
    }
  entries.push_back(std::move(entry));
}

fs::path default_wisdom_path() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "tierlm" / "wisdom.json";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "tierlm" / "wisdom.json";
  return fs::path(".tierlm-wisdom.json");
}

bj::value to_json(const Wisdom& w) {
  bj::array entries;
  for (auto& e : w.entries)
    entries.push_back(bj::object{{"created_at", e.created_at},
                                 {"device_fingerprint", e.plan.device_fingerprint},
                                 {"model_fingerprint", e.plan.model_fingerprint},
                                 {"device", to_json(e.device)},
                                 {"model", to_json(e.model)},
                                 {"plan", to_json(e.plan)}});
  return bj::object{{"schema", "tierlm-wisdom"}, {"schema_version", Wisdom::kSchemaVersion}, {"entries", entries}};
}

std::string recalibrate_command(const fs::path& path, const fs::path& model_dir) {
  return fmt::format("tierlm calibrate --model {}{}", model_dir.empty() ? "DIR" : model_dir.string(),
                     path == default_wisdom_path() ? "" : " --wisdom " + path.string());
}

Wisdom load_wisdom(const fs::path& path, const fs::path& model_dir) {
  Wisdom w;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return w;
    throw WisdomError(fmt::format("cannot read wisdom file {}: {}", path.string(), errno_text(err)));
  }
  std::string text;
  {
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
      throw WisdomError(fmt::format("wisdom file {} is not a regular file; pass --wisdom FILE", path.string()));
    if (uint64_t(st.st_size) > kMaxWisdomBytes)
      throw CorruptWisdomError(path, fmt::format("{} bytes is too large to be a wisdom file", st.st_size), model_dir);
    text.resize(size_t(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw WisdomError(fmt::format("cannot read wisdom file {}: {}", path.string(), errno_text(errno)));
      if (n == 0) break;  // shrank since fstat: parse what is there
      done += size_t(n);
    }
    text.resize(done);
  }
  bj::value v;
  if (std::string problem = parse_problem(text, v); !problem.empty())
    throw CorruptWisdomError(path, problem, model_dir);
  std::string where;  // "entry N: " once inside the entries
  try {
    const auto& o = json::object(v, "the document");
    const std::string schema = json::string(o, "schema", "wisdom");
    if (schema != "tierlm-wisdom") throw std::runtime_error("not a tierlm wisdom file (schema '" + schema + "')");
    const int64_t version = json::integer(o, "schema_version", "wisdom");
    if (version != Wisdom::kSchemaVersion)
      throw std::runtime_error(fmt::format("schema version {}{} (this tierlm reads {})", version,
                                           version > Wisdom::kSchemaVersion ? ", from a newer tierlm" : "",
                                           Wisdom::kSchemaVersion));
    for (auto& e : json::array(o, "entries", "wisdom")) {
      where = fmt::format("entry {}: ", w.entries.size());
      const auto& eo = json::object(e, "wisdom entry");
      WisdomEntry entry;
      entry.created_at = json::string_or(eo, "created_at", "");
      entry.device = device_profile_from_json(json::field(eo, "device", "wisdom entry"));
      entry.model = model_profile_from_json(json::field(eo, "model", "wisdom entry"));
      entry.plan = plan_from_json(json::field(eo, "plan", "wisdom entry"));
      w.entries.push_back(std::move(entry));
    }
  } catch (const std::exception& e) {
    throw CorruptWisdomError(path, where + e.what(), model_dir);
  }
  return w;
}

void save_wisdom(const fs::path& path, const Wisdom& w) {
  create_parent(path);
  WriterLock lock(path);
  remove_stale_temps(path);
  write_atomically(path, w);
}

Wisdom update_wisdom(const fs::path& path, const std::function<void(Wisdom&)>& change) {
  create_parent(path);
  WriterLock lock(path);
  remove_stale_temps(path);
  Wisdom w;
  try {
    w = load_wisdom(path);
  } catch (const CorruptWisdomError& e) {
    const fs::path aside = move_aside(path);
    spdlog::warn("[wisdom] {} is corrupt ({}); kept it as {} and started a new wisdom file", path.string(),
                 e.problem(), aside.string());
  }
  change(w);
  write_atomically(path, w);
  return w;
}

WisdomLookup find_wisdom(const Wisdom& w, const DeviceProfile& device, const fs::path& model_dir,
                         const std::string& model_fp, const fs::path& wisdom_path) {
  WisdomLookup r;
  const std::string device_fp = device.fingerprint(), dir = absolute_path(model_dir);
  const std::string rerun = fmt::format("run `{}`", recalibrate_command(wisdom_path, model_dir));
  for (auto& e : w.entries)
    if (e.plan.device_fingerprint == device_fp && e.plan.model_fingerprint == model_fp) {
      r.status = WisdomLookup::Status::found;
      r.entry = &e;
      return r;
    }
  for (auto& e : w.entries)
    if (e.plan.device_fingerprint == device_fp && absolute_path(e.model.path) == dir) {
      r.status = WisdomLookup::Status::model_changed;
      r.entry = &e;
      r.message = fmt::format("wisdom in {} is stale: the model in {} changed since it was calibrated on {} (model "
                              "fingerprint {} then, {} now); {}",
                              wisdom_path.string(), dir, e.created_at, e.plan.model_fingerprint, model_fp, rerun);
      return r;
    }
  for (auto& e : w.entries)
    if (e.plan.model_fingerprint == model_fp || absolute_path(e.model.path) == dir) {
      r.status = WisdomLookup::Status::hardware_changed;
      r.entry = &e;
      r.message = fmt::format("wisdom in {} was measured on other hardware: [{}], this machine is [{}]; {}",
                              wisdom_path.string(), e.device.identity(), device.identity(), rerun);
      return r;
    }
  r.message = fmt::format("no wisdom for {} on this machine in {}; {}", dir, wisdom_path.string(), rerun);
  return r;
}

}  // namespace tierlm::calibrate
