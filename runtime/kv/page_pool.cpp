#include "runtime/kv/page_pool.h"

#include <atomic>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace tierlm::kv {

namespace {
std::array<std::atomic<uint64_t>, kCodecCount> g_reserved{};
std::array<std::atomic<uint64_t>, kCodecCount> g_used{};
}  // namespace

std::array<CodecBytes, kCodecCount> kv_bytes_by_codec() {
  std::array<CodecBytes, kCodecCount> out{};
  for (int i = 0; i < kCodecCount; ++i)
    out[size_t(i)] = CodecBytes{Codec(i), g_reserved[size_t(i)].load(), g_used[size_t(i)].load()};
  return out;
}

PagePool::PagePool(tiering::Ledger& ledger, Codec codec, size_t page_bytes, int64_t pages)
    : codec_(codec), page_bytes_(page_bytes), pages_(pages),
      storage_(ledger, tiering::accounts::kv, page_bytes * size_t(pages)) {
  if (page_bytes % 64 != 0) throw std::invalid_argument("kv page size must be a multiple of 64 bytes");
  if (!storage_.empty()) std::memset(storage_.data(), 0, storage_.size());
  free_.reserve(size_t(pages));
  for (int64_t i = pages - 1; i >= 0; --i) free_.push_back(storage_.as<uint8_t>() + size_t(i) * page_bytes);
  g_reserved[size_t(codec)] += storage_.size();
}

PagePool::~PagePool() {
  g_reserved[size_t(codec_)] -= storage_.size();
  g_used[size_t(codec_)] -= uint64_t(pages_ - int64_t(free_.size())) * page_bytes_;
}

uint8_t* PagePool::allocate() {
  std::lock_guard lock(mutex_);
  if (free_.empty())
    throw std::length_error(fmt::format("kv page pool ({} codec) is full: {} pages of {} bytes", codec_name(codec_),
                                        pages_, page_bytes_));
  uint8_t* page = free_.back();
  free_.pop_back();
  g_used[size_t(codec_)] += page_bytes_;
  return page;
}

void PagePool::release(uint8_t* page) noexcept {
  std::lock_guard lock(mutex_);
  free_.push_back(page);
  g_used[size_t(codec_)] -= page_bytes_;
}

int64_t PagePool::pages_in_use() const {
  std::lock_guard lock(mutex_);
  return pages_ - int64_t(free_.size());
}

}  // namespace tierlm::kv
