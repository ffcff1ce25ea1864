// tools/peer/synthetic_routing.h — what the random-weight MoE writers (synthetic_mlx_moe, synthetic_deepseek_v2)
// share: a fast deterministic generator, the "massive activation" routing skew and the sharded safetensors writer.
//
// Routing shaped like a trained model's: channel 0 of the residual stream is a constant kMassive in every embedding
// row and no layer writes it (row 0 of every matrix that writes the residual is zero), so after each RMSNorm x[0] is
// a token-independent positive value c_l. Router column 0 of expert e holds -zipf * ln(rank(e) + 1) / c_l (a fixed
// random permutation of ranks per layer): the logit of expert e gets that constant on top of the token-dependent
// x . r_e (unit std), which makes the chosen experts' popularity Zipf-like with exponent ~zipf.
// Owns: those three things. Never: write outside the folder it is given.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/kernels/splitmix64.h"

namespace tierlm::peer {

constexpr float kMassive = 8.0f;      // residual channel 0
constexpr float kOutputScale = 0.2f;  // std of the matrices writing the residual, relative to 1/sqrt(cols)
constexpr float kGrowth = 0.03f;      // estimated growth of the residual's mean square per layer (kOutputScale^2 x ~0.75)

// The synthetic writers' command line: OUT_DIR, then "--key value" pairs among `keys`. --help, an OUT_DIR that starts
// with '-', an unknown key or a key without its value throw std::invalid_argument carrying `usage` (a mistyped
// command must not write gigabytes into a folder named like an option).
struct ToolArgs {
  std::filesystem::path dir;
  std::map<std::string, std::string> options;
  bool has(const std::string& key) const { return options.count(key) > 0; }
  const std::string& at(const std::string& key) const { return options.at(key); }
};

inline ToolArgs parse_tool_args(int argc, char** argv, const std::string& usage,
                                std::initializer_list<const char*> keys) {
  if (argc < 2 || argv[1][0] == '-') throw std::invalid_argument(usage);
  ToolArgs args{argv[1], {}};
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--help" || std::find(keys.begin(), keys.end(), key) == keys.end())
      throw std::invalid_argument("unknown option " + key + "\n" + usage);
    if (i + 1 >= argc) throw std::invalid_argument(key + " needs a value\n" + usage);
    args.options[key] = argv[i + 1];
  }
  return args;
}

// SplitMix64: fast, deterministic, good enough for random weights.
struct Rng {
  uint64_t s;
  uint64_t next() { return kernels::splitmix64_next(s); }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
  float normal() {  // Box-Muller
    const float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

// The popularity ranks of one layer's experts (a fixed random permutation per layer and seed).
inline std::vector<int32_t> expert_ranks(uint64_t seed, int64_t layer, int64_t experts) {
  std::vector<int32_t> rank(static_cast<size_t>(experts));
  std::iota(rank.begin(), rank.end(), 0);
  std::mt19937_64 perm(seed * 31 + uint64_t(layer));
  std::shuffle(rank.begin(), rank.end(), perm);
  return rank;
}

// Router row of an expert with popularity rank `rank` in `layer`: N(0, 1/sqrt(H)) so x . r_e has unit std for an
// RMS-normalized x, and column 0 the popularity term -zipf * ln(rank + 1) / c, c = kMassive / rms(h): the residual's
// mean square is ~1 + kMassive^2 / H from the embedding plus kGrowth per layer before it.
inline void router_row(int64_t hidden, int64_t layer, int32_t rank, double zipf, Rng& rng, float* row) {
  const float sigma = 1.0f / std::sqrt(float(hidden));
  for (int64_t j = 0; j < hidden; ++j) row[j] = sigma * rng.normal();
  const float c = kMassive / std::sqrt(1.0f + kMassive * kMassive / float(hidden) + kGrowth * float(layer));
  row[0] = float(-zipf * std::log(double(rank + 1))) / c;
}

// Writes `tensors` (each with name, dtype, shape, bytes) as model-0000i-of-0000n.safetensors shards of at most
// `shard_limit` bytes (a larger tensor gets a shard of its own) plus model.safetensors.index.json; produce(t, sink)
// streams one tensor's bytes into sink(const void*, size_t); file_name(i, n), when given, names shard i (0-based) of
// n instead. Returns the bytes of tensor data written.
template <class Tensor, class Produce>
uint64_t write_shards(const std::filesystem::path& dir, const std::vector<Tensor>& tensors, uint64_t shard_limit,
                      const char* format, const char* tool, Produce&& produce,
                      const std::function<std::string(size_t, size_t)>& file_name = nullptr) {
  std::vector<std::vector<const Tensor*>> shards(1);
  uint64_t size = 0;
  for (const auto& t : tensors) {
    if (size > 0 && size + t.bytes > shard_limit) shards.emplace_back(), size = 0;
    shards.back().push_back(&t);
    size += t.bytes;
  }
  std::string weight_map;
  uint64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = file_name ? file_name(i, shards.size())
                                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    std::string header = fmt::format(R"({{"__metadata__":{{"format":"{}"}})", format);
    uint64_t offset = 0;
    for (const Tensor* t : shards[i]) {
      header += fmt::format(R"(,"{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t->name, t->dtype,
                            fmt::join(t->shape, ","), offset, offset + t->bytes);
      offset += t->bytes;
      weight_map += fmt::format(R"({}"{}":"{}")", weight_map.empty() ? "" : ",", t->name, file);
    }
    header += "}";
    while (header.size() % 8) header += ' ';
    std::ofstream out(dir / file, std::ios::binary);
    const uint64_t header_size = header.size();
    out.write(reinterpret_cast<const char*>(&header_size), 8);  // little-endian hosts only
    out.write(header.data(), std::streamsize(header.size()));
    for (const Tensor* t : shards[i])
      produce(*t, [&](const void* p, size_t n) { out.write(static_cast<const char*>(p), std::streamsize(n)); });
    if (!out) throw std::runtime_error("cannot write " + (dir / file).string());
    total += offset;
    std::fprintf(stderr, "%s: %s (%.2f GB)\n", tool, file.c_str(), double(offset) / 1e9);
  }
  std::ofstream index(dir / "model.safetensors.index.json");
  index << fmt::format(R"({{"metadata":{{"total_size":{}}},"weight_map":{{{}}}}})", total, weight_map) << "\n";
  return total;
}

}  // namespace tierlm::peer
