// runtime/kv/page_pool.h — fixed-size KV pages carved from one ledger-charged block (account "kv"), handed out and
// taken back through a free list, and the process-wide count of KV bytes by codec that /health publishes.
// Owns: page memory and the telemetry counters. Never: grow past the pages it was created with (allocate() throws
// a LedgerError-style message instead), or hand out the same page twice.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/kv/codec.h"
#include "tiering/ledger.h"

namespace tierlm::kv {

class PagePool {
 public:
  // pages * page_bytes charged to the ledger's "kv" account now; pages start zeroed.
  PagePool(tiering::Ledger& ledger, Codec codec, size_t page_bytes, int64_t pages);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  uint8_t* allocate();  // throws std::length_error when every page is in use
  void release(uint8_t* page) noexcept;

  Codec codec() const { return codec_; }
  size_t page_bytes() const { return page_bytes_; }
  int64_t pages() const { return pages_; }
  int64_t pages_in_use() const;
  uint64_t bytes() const { return storage_.size(); }

 private:
  Codec codec_;
  size_t page_bytes_;
  int64_t pages_;
  tiering::LedgerBuffer storage_;
  mutable std::mutex mutex_;
  std::vector<uint8_t*> free_;
};

// KV memory by codec across the process: reserved = bytes of live pools, used = bytes of pages holding positions.
struct CodecBytes {
  Codec codec;
  uint64_t reserved_bytes = 0;
  uint64_t used_bytes = 0;
};
std::array<CodecBytes, kCodecCount> kv_bytes_by_codec();

}  // namespace tierlm::kv
