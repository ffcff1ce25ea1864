// reusable_prefix (runtime/engine/prefix_reuse.h): the scheduler's prefix-cache length, including the clamp to the
// positions the GPU still holds (without it, a reused slot whose device KV was dropped makes GpuLayers::run throw).
#include "runtime/engine/prefix_reuse.h"

#include <gtest/gtest.h>

#include <vector>

namespace tierlm::engine {
namespace {

const std::vector<int32_t> kCached = {1, 5, 9, 13, 17, 21};

TEST(ReusablePrefix, CommonPrefixOfCachedAndPrompt) {
  EXPECT_EQ(reusable_prefix(kCached, std::vector<int32_t>{1, 5, 9, 40, 41}, std::nullopt), 3);
  EXPECT_EQ(reusable_prefix(kCached, std::vector<int32_t>{2, 5, 9}, std::nullopt), 0);
  EXPECT_EQ(reusable_prefix({}, std::vector<int32_t>{1, 5}, std::nullopt), 0);
  EXPECT_EQ(reusable_prefix(kCached, {}, std::nullopt), 0);
}

TEST(ReusablePrefix, LastPromptTokenIsAlwaysRun) {
  // The whole prompt is cached: all but its last token are reused, so the step still yields its logits.
  EXPECT_EQ(reusable_prefix(kCached, std::vector<int32_t>{1, 5, 9}, std::nullopt), 2);
  EXPECT_EQ(reusable_prefix(kCached, kCached, std::nullopt), 5);
  EXPECT_EQ(reusable_prefix(kCached, std::vector<int32_t>{1}, std::nullopt), 0);
  // A longer prompt continuing the cached tokens reuses every cached position.
  EXPECT_EQ(reusable_prefix(kCached, std::vector<int32_t>{1, 5, 9, 13, 17, 21, 25, 29}, std::nullopt), 6);
}

TEST(ReusablePrefix, ClampedToThePositionsTheDeviceHolds) {
  const std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29};
  // The device dropped this slot's KV: nothing may be reused, though the host still has all six positions.
  EXPECT_EQ(reusable_prefix(kCached, prompt, 0), 0);
  // It holds only part of the host's prefix: reuse stops there.
  EXPECT_EQ(reusable_prefix(kCached, prompt, 3), 3);
  // It holds at least as much as the host: the host's prefix is the limit.
  EXPECT_EQ(reusable_prefix(kCached, prompt, 6), 6);
  EXPECT_EQ(reusable_prefix(kCached, prompt, 100), 6);
  EXPECT_EQ(reusable_prefix(kCached, std::vector<int32_t>{1, 5, 7}, 100), 2);
  EXPECT_EQ(reusable_prefix(kCached, prompt, -1), 0);  // nonsense from a caller still never over-reuses
}

}  // namespace
}  // namespace tierlm::engine
