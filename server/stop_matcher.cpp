#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace tierlm::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  if (stops_.empty()) return std::exchange(pending_, {});
  // The match that completes first wins (as if text arrived one byte at a time, so the result never depends on
  // how it was split into tokens); among those ending together, the longer one. Nothing in pending_ matched before
  // this push, so every match ends in the new text.
  size_t best_start = std::string::npos, best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const auto& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < best_end || (end == best_end && at < best_start)) best_start = at, best_end = end, best = &stop;
  }
  if (best_start != std::string::npos) {
    stopped_ = true;
    matched_ = *best;
    std::string out = pending_.substr(0, best_start);
    pending_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, pending_.size());
    for (size_t k = longest; k > hold; --k)
      if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

}  // namespace tierlm::server
