// calibrate/kv_quality.cpp — see kv_quality.h.
#include "calibrate/kv_quality.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/engine/perplexity.h"
#include "runtime/kernels/thread_pool.h"
#include "runtime/kv/codec.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::calibrate {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kChunk = 64;

std::vector<int32_t> text_tokens(const model::ModelConfig& config, const fs::path& dir, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("kv quality: cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (fs::exists(dir / "tokenizer.json")) return tok::Tokenizer::load(dir).encode(text, /*add_special_tokens=*/true);
  std::vector<int32_t> ids;  // no tokenizer (synthetic models): bytes as token ids, as the router traces do
  for (unsigned char ch : text) ids.push_back(int32_t(ch % uint32_t(config.vocab_size)));
  return ids;
}

}  // namespace

void measure_kv_quality(const model::ModelWeights& weights, const fs::path& model_dir, tiering::Ledger& ledger,
                        const KvQualityOptions& options, ModelProfile& p) {
  p.kv_perplexity_increase.clear();
  p.kv_quality_tokens = 0;
  if (options.max_seconds <= 0) return;
  std::vector<int32_t> tokens = text_tokens(weights.config, model_dir, options.text_path);
  int64_t limit = options.max_tokens;
  if (weights.config.max_position_embeddings > 0) limit = std::min(limit, weights.config.max_position_embeddings);
  if (int64_t(tokens.size()) > limit) tokens.resize(size_t(limit));
  if (int64_t(tokens.size()) < std::min<int64_t>(options.min_tokens, limit)) return;
  kernels::ThreadPool pool(options.threads);
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const engine::KVCacheOptions exact{kv::Codec::f32, {}, {}};

  // One chunk first: the cost per token decides how many tokens the budget pays for (f32 + four codecs).
  const auto start = clock::now();
  engine::perplexity(weights, pool, ledger, std::span(tokens).first(size_t(std::min<int64_t>(kChunk, tokens.size()))),
                     exact, kChunk);
  const double per_token = seconds_since(start) / double(std::min<int64_t>(kChunk, tokens.size()));
  const std::vector<kv::Codec> codecs = {kv::Codec::turbo4, kv::Codec::turbo3, kv::Codec::q8, kv::Codec::f16};
  const double left = options.max_seconds - seconds_since(start);
  const int64_t affordable = per_token > 0 ? int64_t(left / (per_token * double(1 + codecs.size()))) : limit;
  const int64_t n = std::min<int64_t>(int64_t(tokens.size()), affordable);
  if (n < options.min_tokens) {
    spdlog::info("kv quality: not measured ({:.1f} ms a token, {:.0f} s budget: fewer than {} tokens)", per_token * 1e3,
                 options.max_seconds, options.min_tokens);
    return;
  }
  const auto ids = std::span(tokens).first(size_t(n));
  const double base = engine::perplexity(weights, pool, ledger, ids, exact, kChunk).perplexity();
  for (kv::Codec c : codecs) {
    try {
      const double ppl = engine::perplexity(weights, pool, ledger, ids, {c, {}, {}}, kChunk).perplexity();
      p.kv_perplexity_increase[kv::codec_name(c)] = ppl / base - 1;
    } catch (const std::invalid_argument&) {
      // A codec some layer kind does not take (MLA's latent cache keeps f32): not a choice for this model.
    }
  }
  p.kv_quality_tokens = n;
  std::string said;
  for (auto& [codec, increase] : p.kv_perplexity_increase) said += fmt::format(" {} {:+.2f}%", codec, 100 * increase);
  spdlog::info("kv quality: perplexity {:.3f} with the f32 cache over {} tokens;{}", base, n, said);
}

}  // namespace tierlm::calibrate
