// Damaged files must load or fail with ModelError: never crash, never read outside the file (run under ASan too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_convert.h"
#include "tests/runtime/model/safetensors_writer.h"

using namespace tierlm::model;
using namespace tierlm::test;
using namespace std::string_literals;

namespace {

// TIERLM_FUZZ_VARIANTS=N runs N damaged headers instead of the default (for a longer run under ASan).
int variant_count(int fallback) {
  const char* env = std::getenv("TIERLM_FUZZ_VARIANTS");
  return env ? std::max(1, std::atoi(env)) : fallback;
}

std::string valid_file() {
  std::vector<uint8_t> a(24), b(8), c(6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(0x80 + i);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(0x3c + i);
  return build_file({{"model.embed.weight", "F32", {2, 3}, a},
                     {"model.norm.weight", "BF16", {4}, b},
                     {"lm_head.weight", "F16", {1, 3}, c},
                     {"empty", "I8", {0}, {}}},
                    {{"format", "pt"}});
}

// Loads the variant and touches every byte of every tensor; returns "" or what went wrong.
std::string try_load(const std::filesystem::path& path, bool as_folder) {
  try {
    TensorIndex index = as_folder ? TensorIndex::open(path.parent_path()) : TensorIndex::open_file(path);
    for (const auto& [name, info] : index.tensors()) {
      auto bytes = index.data(info);
      if (bytes.size() != info.length) return "span length differs from the tensor length";
      const auto file_size = std::filesystem::file_size(info.file);
      if (info.offset > file_size || info.length > file_size - info.offset) return "tensor range outside its file";
      unsigned sum = 0;
      for (std::byte x : bytes) sum += static_cast<unsigned>(x);
      (void)sum;
      if (info.dtype == DType::F16 || info.dtype == DType::BF16 || info.dtype == DType::F32)
        (void)tensor_to_f32(index, info);
    }
    return "";
  } catch (const ModelError&) {
    return "";
  } catch (const std::exception& e) {
    return std::string("non-ModelError exception: ") + e.what();
  }
}

}  // namespace

TEST(SafetensorsFuzz, EveryTruncation) {
  TempDir dir;
  const std::string file = valid_file();
  const auto path = dir / "model.safetensors";
  size_t loaded = 0;
  for (size_t len = 0; len <= file.size(); ++len) {
    write_bytes(path, file.substr(0, len));
    EXPECT_EQ(try_load(path, true), "") << "truncated at " << len;
    try {
      TensorIndex::open_file(path);
      ++loaded;
    } catch (const ModelError&) {
    }
  }
  EXPECT_GE(loaded, 1u);  // at least the full file
}

TEST(SafetensorsFuzz, RandomHeaderDamage) {
  TempDir dir;
  const std::string file = valid_file();
  const auto path = dir / "model.safetensors";
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<uint8_t>(file[i])) << (8 * i);
  const size_t header_end = 8 + static_cast<size_t>(header_len);
  // Bytes that change JSON structure or numbers are the interesting ones.
  const std::string interesting = "{}[]\",:-0123456789e.E \\\x00\xff"s;
  std::mt19937 rng(1234);
  size_t loaded = 0;
  for (int variant = 0, n = variant_count(600); variant < n; ++variant) {
    std::string damaged = file;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly the JSON header, sometimes the length field.
      size_t at = (rng() % 8 == 0) ? rng() % 8 : 8 + rng() % (header_end - 8);
      if (rng() % 2)
        damaged[at] = interesting[rng() % interesting.size()];
      else
        damaged[at] = static_cast<char>(damaged[at] ^ (1u << (rng() % 8)));
    }
    if (variant % 5 == 0) damaged.resize(rng() % (damaged.size() + 1));
    write_bytes(path, damaged);
    std::string problem = try_load(path, variant % 2 == 0);
    EXPECT_EQ(problem, "") << "variant " << variant;
    if (problem.empty()) {
      try {
        TensorIndex::open_file(path);
        ++loaded;
      } catch (const ModelError&) {
      }
    }
  }
  EXPECT_GT(loaded, 0u);  // some damage (e.g. inside a name) still leaves a valid file
}

// Byte flips mostly break the JSON; this keeps it valid and damages the numbers (shapes, offsets) instead, with the
// header length kept consistent, so the semantic checks are the ones exercised.
TEST(SafetensorsFuzz, RandomNumberDamage) {
  TempDir dir;
  const std::string file = valid_file();
  const auto path = dir / "model.safetensors";
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<uint8_t>(file[i])) << (8 * i);
  const std::string header = file.substr(8, header_len);
  const std::string data = file.substr(8 + header_len);
  std::vector<std::pair<size_t, size_t>> numbers;  // [begin, end) of each digit run
  for (size_t i = 0; i < header.size();) {
    if (std::isdigit(static_cast<unsigned char>(header[i]))) {
      size_t j = i;
      while (j < header.size() && std::isdigit(static_cast<unsigned char>(header[j]))) ++j;
      numbers.emplace_back(i, j);
      i = j;
    } else {
      ++i;
    }
  }
  ASSERT_GT(numbers.size(), 8u);
  const std::vector<std::string> replacements = {"0", "1", "2", "3", "4", "6", "8", "12", "24", "-1", "-0", "1.5",
                                                 "1e3", "1e999", "4294967296", "9223372036854775807",
                                                 "9223372036854775808", "18446744073709551615",
                                                 "18446744073709551616", "[]", "null", "\"7\""};
  std::mt19937 rng(7);
  size_t loaded = 0;
  for (int variant = 0, n = variant_count(600); variant < n; ++variant) {
    std::string damaged = header;
    const int edits = 1 + static_cast<int>(rng() % 3);
    std::vector<size_t> picks;
    for (int e = 0; e < edits; ++e) picks.push_back(rng() % numbers.size());
    std::sort(picks.rbegin(), picks.rend());  // back to front keeps earlier positions valid
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (size_t pick : picks) {
      auto [begin, end] = numbers[pick];
      damaged.replace(begin, end - begin, replacements[rng() % replacements.size()]);
    }
    std::string bytes = raw_file(damaged, data);
    if (variant % 7 == 0) bytes.resize(bytes.size() - rng() % (data.size() + 1));
    write_bytes(path, bytes);
    std::string problem = try_load(path, false);
    EXPECT_EQ(problem, "") << "variant " << variant << ": " << damaged;
    try {
      TensorIndex::open_file(path);
      ++loaded;
    } catch (const ModelError&) {
    }
  }
  EXPECT_GT(loaded, 0u);
}

TEST(SafetensorsFuzz, RandomIndexDamage) {
  TempDir dir;
  write_bytes(dir / "s1.safetensors", valid_file());
  write_bytes(dir / "s2.safetensors", build_file({{"extra", "U8", {2}, {1, 2}}}));
  const std::string index_json = R"({"metadata": {"total_size": 40}, "weight_map": {"model.embed.weight": )"
                                 R"("s1.safetensors", "lm_head.weight": "s1.safetensors", "extra": "s2.safetensors"}})";
  const auto index_path = dir / "model.safetensors.index.json";
  write_bytes(index_path, index_json);
  ASSERT_EQ(try_load(index_path, true), "");
  EXPECT_EQ(TensorIndex::open(dir.path).tensors().size(), 5u);
  const std::string interesting = "{}[]\",:./\\ \x00"s;
  std::mt19937 rng(99);
  for (int variant = 0, n = variant_count(300); variant < n; ++variant) {
    std::string damaged = index_json;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) damaged[rng() % damaged.size()] = interesting[rng() % interesting.size()];
    write_bytes(index_path, damaged);
    EXPECT_EQ(try_load(index_path, true), "") << "variant " << variant << ": " << damaged;
  }
}
