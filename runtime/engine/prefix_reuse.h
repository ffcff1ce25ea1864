// runtime/engine/prefix_reuse.h — how many positions of a slot's cached KV a new prompt may reuse (the scheduler's
// prefix cache). Two limits besides the shared tokens: the prompt's last token always runs (its logits are needed),
// and when layers run on a GPU, the device must still hold the positions too (it may have dropped a sequence's
// device KV to make room; a step that writes past what it holds is refused).
// Never: looks at caches itself; callers pass what the host and the device hold.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace tierlm::engine {

// Length of the common prefix of `cached` and `prompt`, at most prompt.size() - 1, and at most `device_positions`
// when set (GpuLayers::cached_positions of the slot's KV cache; nullopt: no GPU layers).
int64_t reusable_prefix(std::span<const int32_t> cached, std::span<const int32_t> prompt,
                        std::optional<int64_t> device_positions);

}  // namespace tierlm::engine
