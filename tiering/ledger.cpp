#include "tiering/ledger.h"

#include <cstdlib>
#include <new>

#include <fmt/format.h>

namespace tierlm::tiering {

namespace {
std::string human(uint64_t b) {
  if (b == Ledger::kUnlimited) return "unlimited";
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.2f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}
}  // namespace

bool Ledger::try_charge(const std::string& account, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  const uint64_t budget = budget_.load();
  if (bytes > budget || used_ > budget - bytes) return false;
  used_ += bytes;
  if (used_ > peak_) peak_ = used_;
  auto& a = accounts_[account];
  a.name = account;
  a.bytes += bytes;
  a.allocations += 1;
  if (a.bytes > a.peak_bytes) a.peak_bytes = a.bytes;
  return true;
}

void Ledger::charge(const std::string& account, uint64_t bytes) {
  if (try_charge(account, bytes)) return;
  throw LedgerError(fmt::format(
      "memory budget exceeded: account '{}' asked for {} but {} of the {} budget is already in use ({} free)",
      account, human(bytes), human(used()), human(budget()), human(available())));
}

void Ledger::release(const std::string& account, uint64_t bytes) noexcept {
  std::lock_guard lock(mutex_);
  auto it = accounts_.find(account);
  if (it == accounts_.end()) return;
  const uint64_t b = bytes > it->second.bytes ? it->second.bytes : bytes;
  it->second.bytes -= b;
  if (it->second.allocations > 0) it->second.allocations -= 1;
  used_ -= b;
}

void Ledger::set_budget(uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes < used_)
    throw LedgerError(fmt::format("cannot set the memory budget to {}: {} is already in use", human(bytes),
                                  human(used_)));
  budget_.store(bytes);
}

uint64_t Ledger::used() const {
  std::lock_guard lock(mutex_);
  return used_;
}
uint64_t Ledger::peak() const {
  std::lock_guard lock(mutex_);
  return peak_;
}
uint64_t Ledger::available() const {
  std::lock_guard lock(mutex_);
  const uint64_t budget = budget_.load();
  return budget == kUnlimited ? kUnlimited : budget - used_;
}
uint64_t Ledger::used(const std::string& account) const {
  std::lock_guard lock(mutex_);
  auto it = accounts_.find(account);
  return it == accounts_.end() ? 0 : it->second.bytes;
}
std::vector<AccountUsage> Ledger::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<AccountUsage> out;
  for (auto& [name, usage] : accounts_) out.push_back(usage);
  return out;
}

Ledger& Ledger::global() {
  static Ledger ledger;
  return ledger;
}

LedgerBuffer::LedgerBuffer(Ledger& ledger, std::string account, size_t bytes, size_t alignment)
    : ledger_(&ledger), account_(std::move(account)), size_(bytes) {
  if (bytes == 0) return;
  ledger_->charge(account_, bytes);
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  data_ = std::aligned_alloc(alignment, rounded);
  if (!data_) {
    ledger_->release(account_, bytes);
    size_ = 0;
    throw std::bad_alloc();
  }
}

LedgerBuffer& LedgerBuffer::operator=(LedgerBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ledger_ = std::exchange(other.ledger_, nullptr);
    account_ = std::move(other.account_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void LedgerBuffer::reset() noexcept {
  if (data_) {
    std::free(data_);
    if (ledger_) ledger_->release(account_, size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tierlm::tiering
