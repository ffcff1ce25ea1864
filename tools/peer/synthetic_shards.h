// tools/peer/synthetic_shards.h — what the synthetic model writers (synthetic_mlx_moe, synthetic_gpt_oss) share: a
// fast deterministic generator and the safetensors shard writer (consecutive tensors in shards up to a limit, a
// tensor larger than it in a shard of its own, each shard's header padded to 8 bytes, and
// model.safetensors.index.json). Owns: nothing beyond the folder it is given. Never: hold a tensor in memory; its
// bytes come from the caller's producer in pieces.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tierlm::peer {

// SplitMix64: fast, deterministic, good enough for random weights.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
  float normal() {  // Box-Muller
    const float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

struct ShardTensor {
  std::string name, dtype;  // safetensors dtype: "BF16", "U8", "U32", ...
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

struct ShardOptions {
  uint64_t limit = 5'000'000'000ull;
  std::string format;  // __metadata__.format ("pt", "mlx")
  // The name of shard `index` (0-based) of `count`.
  std::function<std::string(size_t index, size_t count)> file_name;
  std::string log_prefix;  // the tool's name, for its progress lines on stderr
};

using ShardSink = std::function<void(const void*, size_t)>;

// Writes the tensors in order; produce(i, sink) hands tensor i's bytes to sink, in as many pieces as it likes.
// Returns the bytes of tensor data written.
inline uint64_t write_shards(const std::filesystem::path& dir, const std::vector<ShardTensor>& tensors,
                             const ShardOptions& o, const std::function<void(size_t, const ShardSink&)>& produce) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (size > 0 && size + tensors[i].bytes > o.limit) shards.emplace_back(), size = 0;
    shards.back().push_back(i);
    size += tensors[i].bytes;
  }
  std::string weight_map;
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = o.file_name(s, shards.size());
    std::string header = fmt::format(R"({{"__metadata__":{{"format":"{}"}})", o.format);
    uint64_t offset = 0;
    for (size_t i : shards[s]) {
      const ShardTensor& t = tensors[i];
      header += fmt::format(R"(,"{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t.name, t.dtype,
                            fmt::join(t.shape, ","), offset, offset + t.bytes);
      offset += t.bytes;
      weight_map += fmt::format(R"({}"{}":"{}")", weight_map.empty() ? "" : ",", t.name, file);
    }
    header += "}";
    while (header.size() % 8) header += ' ';
    std::ofstream out(dir / file, std::ios::binary);
    const uint64_t header_size = header.size();
    out.write(reinterpret_cast<const char*>(&header_size), 8);  // little-endian hosts only
    out.write(header.data(), std::streamsize(header.size()));
    const ShardSink sink = [&](const void* p, size_t n) { out.write(static_cast<const char*>(p), std::streamsize(n)); };
    for (size_t i : shards[s]) produce(i, sink);
    if (!out) throw std::runtime_error("cannot write " + (dir / file).string());
    total += offset;
    std::fprintf(stderr, "%s: %s (%.2f GB)\n", o.log_prefix.c_str(), file.c_str(), double(offset) / 1e9);
  }
  std::ofstream index(dir / "model.safetensors.index.json");
  index << fmt::format(R"({{"metadata":{{"total_size":{}}},"weight_map":{{{}}}}})", total, weight_map) << "\n";
  if (!index) throw std::runtime_error("cannot write " + (dir / "model.safetensors.index.json").string());
  return total;
}

}  // namespace tierlm::peer
