// tiering/ledger.h — the memory ledger: every large allocation (weights, experts, expert cache, KV, scratch) is
// charged to a named account here before it exists, so the budget is a hard limit and /health can report usage.
// The ledger never allocates memory itself except through LedgerBuffer; it must never let the total exceed the budget.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tierlm::tiering {

// Well-known account names; any other name is allowed too.
namespace accounts {
inline constexpr const char* weights = "weights";
inline constexpr const char* resident_experts = "resident_experts";
inline constexpr const char* expert_cache = "expert_cache";
inline constexpr const char* kv = "kv";
inline constexpr const char* scratch = "scratch";
}  // namespace accounts

class LedgerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct AccountUsage {
  std::string name;
  uint64_t bytes = 0;       // currently charged
  uint64_t peak_bytes = 0;  // high-water mark
  uint64_t allocations = 0; // live reservations
};

class Ledger {
 public:
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();
  explicit Ledger(uint64_t budget_bytes = kUnlimited) : budget_(budget_bytes) {}
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Charges `bytes` to `account`; throws LedgerError (naming account, request and budget) if it would exceed budget.
  void charge(const std::string& account, uint64_t bytes);
  // Same as charge but returns false instead of throwing.
  bool try_charge(const std::string& account, uint64_t bytes);
  void release(const std::string& account, uint64_t bytes) noexcept;

  uint64_t budget() const { return budget_.load(); }
  // Lowering the budget below current use is refused (throws) — it could never be honoured.
  void set_budget(uint64_t bytes);
  uint64_t used() const;
  uint64_t peak() const;
  uint64_t available() const;
  uint64_t used(const std::string& account) const;
  std::vector<AccountUsage> snapshot() const;

  // The process-wide ledger used when no other is given.
  static Ledger& global();

 private:
  mutable std::mutex mutex_;
  std::atomic<uint64_t> budget_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
  std::map<std::string, AccountUsage> accounts_;
};

// Owns an aligned heap block charged to a ledger account for its whole life. Move-only.
class LedgerBuffer {
 public:
  LedgerBuffer() = default;
  LedgerBuffer(Ledger& ledger, std::string account, size_t bytes, size_t alignment = 64);
  ~LedgerBuffer() { reset(); }
  LedgerBuffer(LedgerBuffer&& other) noexcept { *this = std::move(other); }
  LedgerBuffer& operator=(LedgerBuffer&& other) noexcept;
  LedgerBuffer(const LedgerBuffer&) = delete;
  LedgerBuffer& operator=(const LedgerBuffer&) = delete;

  void reset() noexcept;
  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T> T* as() { return static_cast<T*>(data_); }
  template <class T> const T* as() const { return static_cast<const T*>(data_); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::string& account() const { return account_; }

 private:
  Ledger* ledger_ = nullptr;
  std::string account_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tierlm::tiering
