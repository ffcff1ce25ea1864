// tests/tiering/packed_experts_fixture.h — what the expert tier tests share: random file bytes, writing a file, and a
// packed store of 1 layer x 6 tiny f32 experts (expert e's block starts with float(e)) in a temporary folder, with
// its reader and a ledger for the cache under test.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "tests/runtime/model/safetensors_writer.h"
#include "tiering/expert_cache.h"

namespace tierlm::test {

inline std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = char(rng());
  return s;
}

// (Re)writes the file in place: an existing file keeps its inode, so a reader's descriptors stay valid.
inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

struct PackedExperts {
  TempDir dir;
  std::filesystem::path path = dir / "e.tierlm";
  std::unique_ptr<tiering::ExpertStore> store;
  std::unique_ptr<tiering::ExpertReader> reader;
  tiering::Ledger ledger;
  PackedExperts() {
    tiering::PackedHeader h{1, 6, tiering::ExpertLayout::make(kernels::WeightFormat::f32, 32, 32)};
    tiering::write_packed_experts(path, h, [](int64_t, int64_t e, void* block) {
      static_cast<float*>(block)[0] = float(e);
    });
    store = std::make_unique<tiering::ExpertStore>(tiering::ExpertStore::open_packed(path));
    reader = std::make_unique<tiering::ExpertReader>(store->files());
  }
  static float first(const tiering::ExpertViews& v) { return static_cast<const float*>(v.gate_up.data)[0]; }
  // One use of expert e: request, acquire (its block must be e's), release.
  void use(tiering::ExpertCache& c, int32_t e) {
    c.request(0, std::span(&e, 1));
    EXPECT_EQ(first(c.acquire(0, e)), float(e));
    c.release(0, e);
  }
};

}  // namespace tierlm::test
