#include "tiering/expert_reader.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tierlm::tiering {

struct ExpertReader::Ring {
  io_uring ring;
};

namespace {

int open_file(const std::string& path, bool direct) {
  return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
}

}  // namespace

ExpertReader::ExpertReader(std::vector<std::string> files, ReaderOptions options)
    : options_(options), paths_(std::move(files)) {
  if (options_.queue_depth == 0) options_.queue_depth = 1;
  if (options_.block_size < alignment_) options_.block_size = alignment_;
  options_.block_size = options_.block_size / alignment_ * alignment_;
  for (const std::string& path : paths_) {
    int fd = -1;
    bool direct = false;
    if (options_.direct) {
      fd = open_file(path, true);
      direct = fd >= 0;
      if (fd < 0 && errno == EINVAL)
        spdlog::warn("[tiering] {}: O_DIRECT refused by the file system; expert reads fall back to buffered pread "
                     "(they go through the page cache)", path);
    }
    if (fd < 0) fd = open_file(path, false);
    if (fd < 0) {
      const int err = errno;
      for (int open_fd : fds_) ::close(open_fd);
      throw ReaderError(fmt::format("{}: cannot open for expert reads: {}", path, std::strerror(err)));
    }
    struct stat st {};
    ::fstat(fd, &st);
    fds_.push_back(fd);
    direct_.push_back(direct);
    sizes_.push_back(uint64_t(st.st_size));
  }
  auto ring = std::make_unique<Ring>();
  const int rc = io_uring_queue_init(options_.queue_depth, &ring->ring, 0);
  if (rc == 0) {
    ring_ = std::move(ring);
  } else {
    spdlog::warn("[tiering] io_uring unavailable ({}); expert reads use synchronous pread", std::strerror(-rc));
  }
}

ExpertReader::~ExpertReader() {
  try {
    drain();
  } catch (...) {
  }
  if (ring_) io_uring_queue_exit(&ring_->ring);
  for (int fd : fds_) ::close(fd);
}

bool ExpertReader::direct(int32_t file) const { return direct_.at(size_t(file)); }

ExpertReader::Ticket ExpertReader::submit(std::span<const ReadRequest> requests) {
  const Ticket ticket = next_ticket_++;
  uint32_t chunks = 0;
  for (const ReadRequest& r : requests) {
    if (r.file < 0 || size_t(r.file) >= fds_.size()) throw ReaderError(fmt::format("read of unknown file {}", r.file));
    if (direct_[size_t(r.file)] && (r.offset % alignment_ || r.length % alignment_ ||
                                    reinterpret_cast<uintptr_t>(r.dest) % alignment_))
      throw ReaderError(fmt::format("{}: O_DIRECT read at {} of {} bytes is not {}-byte aligned",
                                    paths_[size_t(r.file)], r.offset, r.length, alignment_));
    for (uint64_t done = 0; done < r.length; done += options_.block_size) {
      const uint64_t len = std::min(options_.block_size, r.length - done);
      pending_.push_back({ticket, r.file, r.offset + done, len, static_cast<char*>(r.dest) + done});
      ++chunks;
    }
    ++stats_.requests;
  }
  outstanding_.push_back(chunks);
  if (chunks == 0) complete_empty(ticket);
  pump(false);
  return ticket;
}

void ExpertReader::complete_empty(Ticket ticket) {
  (void)ticket;
  while (!outstanding_.empty() && outstanding_.front() == 0) {
    outstanding_.pop_front();
    ++first_live_;
  }
}

void ExpertReader::complete(Ticket ticket) {
  uint32_t& left = outstanding_[size_t(ticket - first_live_)];
  --left;
  complete_empty(ticket);
}

void ExpertReader::fail(Ticket ticket, std::string error) { errors_.try_emplace(ticket, std::move(error)); }

void ExpertReader::read_buffered(const Chunk& c) {
  uint64_t done = 0;
  while (done < c.length) {
    const ssize_t n = ::pread(fds_[size_t(c.file)], c.dest + done, c.length - done, off_t(c.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fail(c.ticket,
           fmt::format("{}: read at {} failed: {}", paths_[size_t(c.file)], c.offset + done, std::strerror(errno)));
      break;
    }
    if (n == 0) {
      if (c.offset + done < sizes_[size_t(c.file)])
        fail(c.ticket, fmt::format("{}: unexpected end of file at {}", paths_[size_t(c.file)], c.offset + done));
      break;
    }
    done += uint64_t(n);
    stats_.bytes_read += uint64_t(n);
  }
  ++stats_.reads;
}

void ExpertReader::pump(bool block) {
  // Start queued reads up to the queue depth; buffered ones run right here.
  bool queued = false;
  while (!pending_.empty() && in_flight_ < options_.queue_depth) {
    Chunk c = pending_.front();
    pending_.pop_front();
    if (!ring_ || !direct_[size_t(c.file)]) {
      read_buffered(c);
      complete(c.ticket);
      continue;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    if (!sqe) {
      pending_.push_front(c);
      break;
    }
    auto* owned = new Chunk(c);
    io_uring_prep_read(sqe, fds_[size_t(c.file)], c.dest, unsigned(c.length), c.offset);
    io_uring_sqe_set_data(sqe, owned);
    ++in_flight_;
    queued = true;
  }
  if (queued) io_uring_submit(&ring_->ring);
  if (!ring_ || in_flight_ == 0) return;

  io_uring_cqe* cqe = nullptr;
  if (block) {
    int rc;
    do rc = io_uring_wait_cqe(&ring_->ring, &cqe);
    while (rc == -EINTR);
    if (rc < 0) throw ReaderError(fmt::format("io_uring wait failed: {}", std::strerror(-rc)));
  }
  while (io_uring_peek_cqe(&ring_->ring, &cqe) == 0) {
    std::unique_ptr<Chunk> c(static_cast<Chunk*>(io_uring_cqe_get_data(cqe)));
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_->ring, cqe);
    --in_flight_;
    const std::string& path = paths_[size_t(c->file)];
    if (res == -EAGAIN || res == -EINTR) {
      pending_.push_front(*c);
    } else if (res == -EINVAL && direct_[size_t(c->file)]) {
      // Opened with O_DIRECT but the file system refuses the read: reopen buffered and carry on.
      spdlog::warn("[tiering] {}: O_DIRECT read refused; falling back to buffered pread", path);
      const int fd = open_file(path, false);
      if (fd < 0) throw ReaderError(fmt::format("{}: cannot reopen buffered: {}", path, std::strerror(errno)));
      ::close(fds_[size_t(c->file)]);
      fds_[size_t(c->file)] = fd;
      direct_[size_t(c->file)] = false;
      pending_.push_front(*c);
    } else if (res < 0) {
      fail(c->ticket, fmt::format("{}: read at {} failed: {}", path, c->offset, std::strerror(-res)));
      ++stats_.reads;
      complete(c->ticket);
    } else {
      stats_.bytes_read += uint64_t(res);
      ++stats_.reads;
      const uint64_t got = uint64_t(res);
      if (got < c->length && c->offset + got < sizes_[size_t(c->file)]) {
        if (got == 0) {
          fail(c->ticket, fmt::format("{}: unexpected end of file at {}", path, c->offset));
          complete(c->ticket);
        } else {  // short read inside the file: read the rest
          pending_.push_front({c->ticket, c->file, c->offset + got, c->length - got, c->dest + got});
        }
      } else {
        complete(c->ticket);
      }
    }
  }
  if (!pending_.empty() && in_flight_ < options_.queue_depth) pump(false);
}

bool ExpertReader::done(Ticket ticket) {
  if (ticket >= first_live_ && ticket < next_ticket_) pump(false);
  return ticket < first_live_ || outstanding_[size_t(ticket - first_live_)] == 0;
}

void ExpertReader::wait(Ticket ticket) {
  if (!done(ticket)) {
    const auto start = std::chrono::steady_clock::now();
    while (!(ticket < first_live_ || outstanding_[size_t(ticket - first_live_)] == 0)) pump(true);
    stats_.stall_ns += uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }
  if (const auto it = errors_.find(ticket); it != errors_.end()) {
    const std::string error = std::move(it->second);
    errors_.erase(it);
    throw ReaderError(error);
  }
}

void ExpertReader::wait_any() {
  if (in_flight_ == 0 && pending_.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  pump(true);
  stats_.stall_ns += uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
}

void ExpertReader::drain() {
  while (in_flight_ > 0 || !pending_.empty()) pump(in_flight_ > 0);
}

}  // namespace tierlm::tiering
