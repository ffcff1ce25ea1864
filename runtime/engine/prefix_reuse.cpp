#include "runtime/engine/prefix_reuse.h"

#include <algorithm>

namespace tierlm::engine {

int64_t reusable_prefix(std::span<const int32_t> cached, std::span<const int32_t> prompt,
                        std::optional<int64_t> device_positions) {
  if (prompt.empty()) return 0;
  size_t limit = std::min(cached.size(), prompt.size() - 1);  // the last prompt token is always run
  if (device_positions) limit = std::min(limit, size_t(std::max<int64_t>(*device_positions, 0)));
  size_t common = 0;
  while (common < limit && cached[common] == prompt[common]) ++common;
  return int64_t(common);
}

}  // namespace tierlm::engine
