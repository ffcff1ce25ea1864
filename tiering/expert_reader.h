// tiering/expert_reader.h — asynchronous reads of expert bytes from the model files: io_uring with O_DIRECT, so
// expert streaming bypasses the page cache (the memory budget holds, and every byte read is one we counted).
// Reads are split into block_size chunks with at most queue_depth in flight; completion is polled by the caller's
// thread (no reader thread), so reads proceed in the kernel while the caller computes.
// Falls back, with one warning per file, to buffered pread where O_DIRECT is refused (ramfs, some FUSE/overlay
// mounts) or io_uring is unavailable.
// Owns: the file descriptors and the ring. Never: allocate destination memory (callers pass ledger buffers), or be
// used from two threads at once.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace tierlm::tiering {

struct ReaderOptions {
  unsigned queue_depth = 32;          // reads in flight at once
  uint64_t block_size = 1ull << 20;   // largest single read; longer requests are split
  bool direct = true;                 // O_DIRECT (with buffered fallback); false: buffered pread always
};

// One read: `length` bytes at `offset` of file `file` into `dest`. With O_DIRECT, offset, length and dest must be
// multiples of alignment() (reads may run past the end of the file; the tail is then left untouched).
struct ReadRequest {
  int32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dest = nullptr;
};

struct ReaderStats {
  uint64_t bytes_read = 0;     // bytes the device returned
  uint64_t reads = 0;          // read operations completed (chunks)
  uint64_t requests = 0;       // ReadRequests submitted
  uint64_t stall_ns = 0;       // time spent blocked in wait() and wait_any()
};

class ReaderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ExpertReader {
 public:
  using Ticket = uint64_t;

  ExpertReader(std::vector<std::string> files, ReaderOptions options = {});
  ~ExpertReader();
  ExpertReader(const ExpertReader&) = delete;
  ExpertReader& operator=(const ExpertReader&) = delete;

  // Queues the reads and starts as many as the queue depth allows; returns a ticket to wait on.
  Ticket submit(std::span<const ReadRequest> requests);
  // True once every read of the ticket has completed (makes progress on the queue; never blocks).
  bool done(Ticket ticket);
  // Blocks until every read of the ticket has completed; the time blocked is counted as read stall.
  // Throws ReaderError (file and offset) if one of this ticket's reads failed (an I/O error or a file shorter than
  // when it was opened), once: errors belong to their ticket, so other tickets complete normally and the reader
  // keeps working.
  void wait(Ticket ticket);
  // Blocks until at least one read in flight completes (returns at once when nothing is queued), counted as read
  // stall: for a caller that has other completed reads to hand on while it waits for a particular one. An error is
  // reported by wait() of the ticket it belongs to.
  void wait_any();
  // Blocks until nothing is in flight.
  void drain();

  uint64_t alignment() const { return alignment_; }
  bool direct(int32_t file) const;
  bool using_io_uring() const { return ring_ != nullptr; }
  const ReaderStats& stats() const { return stats_; }
  const ReaderOptions& options() const { return options_; }
  const std::vector<std::string>& files() const { return paths_; }

 private:
  struct Chunk {
    Ticket ticket;
    int32_t file;
    uint64_t offset, length;
    char* dest;
  };
  struct Ring;
  void pump(bool block);
  void complete(Ticket ticket);
  void complete_empty(Ticket ticket);
  void read_buffered(const Chunk& c);
  void fail(Ticket ticket, std::string error);  // keeps the ticket's first error

  ReaderOptions options_;
  std::vector<std::string> paths_;
  std::vector<int> fds_;
  std::vector<bool> direct_;
  std::vector<uint64_t> sizes_;
  uint64_t alignment_ = 4096;
  std::unique_ptr<Ring> ring_;
  std::deque<Chunk> pending_;
  unsigned in_flight_ = 0;
  Ticket next_ticket_ = 1;
  // Outstanding chunk counts of live tickets, indexed by ticket - first_live_.
  std::deque<uint32_t> outstanding_;
  Ticket first_live_ = 1;
  ReaderStats stats_;
  // Failed tickets, until wait() reports them: the first error of each.
  std::unordered_map<Ticket, std::string> errors_;
};

}  // namespace tierlm::tiering
