#include "runtime/hub/downloader.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <memory>
#include <set>

#include <curl/curl.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "runtime/hub/blob_check.h"
#include "runtime/hub/download_progress.h"
#include "runtime/hub/hub_error.h"

namespace tierlm::hub {

namespace fs = std::filesystem;

namespace {

struct Transfer {
  const BlobTask* task = nullptr;
  fs::path incomplete;
  int fd = -1;
  uint64_t offset = 0;        // where the next byte goes
  uint64_t range_start = 0;   // what the request asked for
  HttpReply reply;            // status and headers of the last response in the redirect chain
  int write_errno = 0;
  DownloadProgress* progress = nullptr;
  uint64_t* fetched = nullptr;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;

  ~Transfer() {
    if (fd >= 0) ::close(fd);
    if (headers) curl_slist_free_all(headers);
    if (easy) curl_easy_cleanup(easy);
  }
};

// The per-blob lock file of the Python and JS clients, held for the whole write of one blob. Taken without waiting:
// a blob another process is writing is tried again later, so two pulls that each hold one blob the other needs
// never wait on each other.
class BlobLock {
 public:
  explicit BlobLock(const fs::path& path) {
    fs::create_directories(path.parent_path());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw HubError("cannot open the lock " + path.string() + ": " + std::strerror(errno));
  }
  bool try_acquire() { return ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {
    t->reply.headers.clear();
    const size_t space = line.find(' ');
    t->reply.status = space == std::string::npos ? 0 : std::strtol(line.c_str() + space + 1, nullptr, 10);
    return size * count;
  }
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    for (auto& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) value.pop_back();
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front()))) value.erase(0, 1);
    t->reply.headers[name] = value;
  }
  return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (t->reply.status < 200 || t->reply.status >= 300) {  // an error page: keep a little for the message
    if (t->reply.body.size() < 2048) t->reply.body.append(data, std::min<size_t>(n, 2048));
    return n;
  }
  if (t->reply.status == 206 && t->offset == t->range_start) {
    // The part must start where the temp file ends, or the bytes would land in the wrong place.
    const std::string range = t->reply.header("content-range");
    const size_t space = range.find(' ');
    if (space == std::string::npos || std::strtoull(range.c_str() + space + 1, nullptr, 10) != t->range_start) {
      t->reply.transport_error = "the server answered the range request with '" + range + "'";
      return 0;
    }
  }
  if (t->reply.status == 200 && t->offset == t->range_start && t->range_start > 0) {
    // The server ignored Range and sends the whole file: start the temp file over.
    if (::ftruncate(t->fd, 0) != 0) {
      t->write_errno = errno;
      return 0;
    }
    t->offset = t->range_start = 0;
  }
  size_t written = 0;
  while (written < n) {
    const ssize_t w = ::pwrite(t->fd, data + written, n - written, off_t(t->offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      t->write_errno = errno;
      return 0;  // libcurl stops this transfer with a write error
    }
    written += size_t(w);
    t->offset += uint64_t(w);
  }
  *t->fetched += n;
  t->progress->add(n);
  return n;
}

std::string free_space_at(const fs::path& path) {
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) return "unknown";
  return human_bytes(double(vfs.f_bavail) * double(vfs.f_frsize));
}

std::unique_ptr<Transfer> start_transfer(const HubSettings& settings, const RepoCache& cache, const BlobTask& task,
                                         DownloadProgress& progress, uint64_t& fetched) {
  auto t = std::make_unique<Transfer>();
  t->task = &task;
  t->incomplete = cache.incomplete_path(task.meta.etag);
  t->fd = ::open(t->incomplete.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (t->fd < 0) throw HubError(task.filename + ": cannot create " + t->incomplete.string() + ": " + std::strerror(errno));
  struct stat st {};
  ::fstat(t->fd, &st);
  t->offset = uint64_t(st.st_size);
  if (task.meta.size > 0 && t->offset > task.meta.size) {  // longer than the file: not ours to resume
    if (::ftruncate(t->fd, 0) != 0) throw HubError(task.filename + ": cannot truncate " + t->incomplete.string());
    t->offset = 0;
  }
  t->range_start = t->offset;
  t->progress = &progress;
  t->fetched = &fetched;
  if (task.meta.size > 0 && t->offset == task.meta.size) return t;  // all bytes are here: check them only
  if (t->offset > 0) spdlog::info("hub: resuming {} at {} of {}", task.filename, human_bytes(double(t->offset)),
                                  human_bytes(double(task.meta.size)));
  t->easy = curl_easy_init();
  t->headers = curl_slist_append(t->headers, "Accept-Encoding: identity");
  t->headers = curl_slist_append(t->headers, "User-Agent: tierlm/0.1 (hub client)");
  if (const std::string auth = settings.authorization_for(task.meta.download_url); !auth.empty())
    t->headers = curl_slist_append(t->headers, auth.c_str());
  if (t->offset > 0) t->headers = curl_slist_append(t->headers, ("Range: bytes=" + std::to_string(t->offset) + "-").c_str());
  curl_easy_setopt(t->easy, CURLOPT_URL, task.meta.download_url.c_str());
  curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
  curl_easy_setopt(t->easy, CURLOPT_FOLLOWLOCATION, 1L);  // libcurl drops our Authorization on another host
  curl_easy_setopt(t->easy, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(t->easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(t->easy, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(t->easy, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(t->easy, CURLOPT_HEADERDATA, t.get());
  curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t.get());
  return t;
}

// After the transfer: the error for this file, or "" when the blob is in place and linked.
std::string finish_transfer(Transfer& t, CURLcode result, const HubSettings& settings, const RepoCache& cache,
                            const std::string& repo, const std::string& commit) {
  const BlobTask& task = *t.task;
  const std::string where = repo + ": " + task.filename;
  const std::string kept = " The partial file is kept in " + t.incomplete.string() +
                           " and the next run resumes it; complete files are kept.";
  if (t.write_errno != 0) {
    const bool full = t.write_errno == ENOSPC || t.write_errno == EFBIG || t.write_errno == EDQUOT;
    const std::string limit = t.write_errno == EFBIG ? "the file-size limit (ulimit -f) or the file system's largest "
                                                       "file was reached, "
                                                     : "";
    return where + ": cannot write " + t.incomplete.string() + ": " + std::strerror(t.write_errno) +
           (full ? " (" + limit + free_space_at(cache.root()) + " free under " + cache.root().string() +
                       "). Free some space or set HF_HUB_CACHE to a larger disk, then run the same command again."
                 : ".") +
           kept;
  }
  if (!t.reply.transport_error.empty())
    return where + ": " + t.reply.transport_error + "; run the same command again." + kept;
  if (t.easy && result != CURLE_OK)
    return where + ": the download stopped at " + human_bytes(double(t.offset)) + " of " +
           human_bytes(double(task.meta.size)) + " (network: " + curl_easy_strerror(result) + " from " +
           settings.endpoint + "). Check the connection or proxy, then run the same command again." + kept;
  if (t.easy && t.reply.status != 416) {
    try {
      check_reply(t.reply, settings, repo, task.filename, "downloading the file");
    } catch (const HubError& e) {
      return e.what();
    }
  }
  struct stat st {};
  ::fstat(t.fd, &st);
  if (task.meta.size > 0 && uint64_t(st.st_size) != task.meta.size)
    return where + ": the hub sent " + human_bytes(double(st.st_size)) + " of " + human_bytes(double(task.meta.size)) +
           " and closed. Run the same command again to resume." + kept;
  if (::fsync(t.fd) != 0) return where + ": cannot flush " + t.incomplete.string() + ": " + std::strerror(errno) + kept;
  ::close(t.fd);
  t.fd = -1;
  if (!matches_etag(t.incomplete, task.meta.etag, task.meta.lfs)) {
    const std::string got = task.meta.lfs ? file_sha256(t.incomplete) : file_git_blob_sha1(t.incomplete);
    std::error_code ec;
    fs::remove(t.incomplete, ec);  // resuming a corrupt file cannot repair it
    return where + ": checksum mismatch: the hub named it " + std::string(task.meta.lfs ? "sha256 " : "git sha1 ") +
           task.meta.etag + " but the bytes received hash to " + got +
           ". The file was discarded and is not in the cache. Run the command again; if it repeats, the server at " +
           settings.endpoint + " (HF_ENDPOINT) serves a different file than it names.";
  }
  fs::rename(t.incomplete, cache.blob_path(task.meta.etag));
  cache.link_snapshot_file(commit, task.filename, task.meta.etag);
  return "";
}

}  // namespace

DownloadReport download_blobs(const HubSettings& settings, const RepoCache& cache, const std::string& repo,
                              const std::string& commit, const std::vector<BlobTask>& tasks, int parallel) {
  ensure_curl_initialised();
  DownloadReport report;
  fs::create_directories(cache.folder() / "blobs");
  // Past a file-size limit, a write fails with EFBIG (reported like a full disk) instead of killing the process.
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &previous);

  std::deque<const BlobTask*> waiting;
  uint64_t total = 0, already = 0;
  for (const auto& task : tasks) {
    if (fs::exists(cache.blob_path(task.meta.etag))) {
      cache.link_snapshot_file(commit, task.filename, task.meta.etag);
      continue;
    }
    std::error_code ec;
    const auto partial = fs::file_size(cache.incomplete_path(task.meta.etag), ec);
    total += task.meta.size;
    if (!ec) already += std::min<uint64_t>(partial, task.meta.size);
    waiting.push_back(&task);
  }
  if (waiting.empty()) {
    ::sigaction(SIGXFSZ, &previous, nullptr);
    return report;
  }
  spdlog::info("hub: fetching {} file(s) of {} into {}", waiting.size(), repo, cache.folder().string());
  DownloadProgress progress("download " + repo, total, already);

  CURLM* multi = curl_multi_init();
  std::vector<std::pair<std::unique_ptr<Transfer>, std::unique_ptr<BlobLock>>> running;
  auto finish = [&](Transfer* t, CURLcode result) {
    const std::string error = finish_transfer(*t, result, settings, cache, repo, commit);
    if (!error.empty()) report.errors.push_back(error);
    for (auto it = running.begin(); it != running.end(); ++it)
      if (it->first.get() == t) {
        if (t->easy) curl_multi_remove_handle(multi, t->easy);
        running.erase(it);
        break;
      }
  };
  std::set<const BlobTask*> told_busy;
  auto launch = [&] {
    for (size_t tries = waiting.size(); tries > 0 && !waiting.empty() && int(running.size()) < std::max(1, parallel);
         --tries) {
      const BlobTask* task = waiting.front();
      waiting.pop_front();
      try {
        auto lock = std::make_unique<BlobLock>(cache.lock_path(task->meta.etag));
        if (!lock->try_acquire()) {  // another process is writing this blob: come back to it
          if (told_busy.insert(task).second)
            spdlog::info("hub: another download of {} is under way; waiting for it", task->filename);
          waiting.push_back(task);
          continue;
        }
        if (fs::exists(cache.blob_path(task->meta.etag))) {  // another process finished it while we waited
          cache.link_snapshot_file(commit, task->filename, task->meta.etag);
          continue;
        }
        auto t = start_transfer(settings, cache, *task, progress, report.bytes_fetched);
        Transfer* raw = t.get();
        running.emplace_back(std::move(t), std::move(lock));
        if (raw->easy) {
          curl_multi_add_handle(multi, raw->easy);
        } else {
          finish(raw, CURLE_OK);  // nothing left to fetch: check and rename
        }
      } catch (const std::exception& e) {
        report.errors.push_back(e.what());
      }
    }
  };
  launch();
  int still_running = 0;
  do {
    curl_multi_perform(multi, &still_running);
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(multi, &queued)) {
      if (message->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, &t);
      finish(t, message->data.result);
    }
    launch();
    if (!running.empty()) {
      curl_multi_poll(multi, nullptr, 0, 200, nullptr);
    } else if (!waiting.empty()) {
      ::usleep(200'000);  // every remaining blob is being written by another process
    }
  } while (!running.empty() || !waiting.empty());
  curl_multi_cleanup(multi);
  progress.finish();
  ::sigaction(SIGXFSZ, &previous, nullptr);
  return report;
}

}  // namespace tierlm::hub
