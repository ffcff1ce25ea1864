// server/log_throttle.h — lets a repeating log line through at most once per interval and counts the ones it held
// back, so a failure that repeats thousands of times a second (accept() out of file descriptors) costs one line per
// interval, not a disk full of them. Thread-safe. Never: logs by itself (the caller writes the line).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>

namespace tierlm::server {

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(Clock::duration interval) : interval_(interval) {}

  // When a line may be written now: how many were held back since the last one. nullopt: hold this one back.
  std::optional<uint64_t> allow(Clock::time_point now = Clock::now()) {
    std::lock_guard lock(mutex_);
    if (last_ && now - *last_ < interval_) {
      ++suppressed_;
      return std::nullopt;
    }
    last_ = now;
    const uint64_t held = suppressed_;
    suppressed_ = 0;
    return held;
  }

 private:
  std::mutex mutex_;
  Clock::duration interval_;
  std::optional<Clock::time_point> last_;
  uint64_t suppressed_ = 0;
};

}  // namespace tierlm::server
