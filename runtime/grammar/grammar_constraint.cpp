// The per-sequence TokenConstraint over a Grammar and a Vocabulary, and the Grammar's cache of token masks.
#include <algorithm>
#include <bit>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/grammar/byte_matcher.h"
#include "runtime/grammar/vocabulary.h"
#include "tiering/ledger.h"

namespace tierlm::grammar {

namespace {

constexpr const char* kLedgerAccount = "grammar";
constexpr uint64_t kMaxCachedBytesPerGrammar = uint64_t(32) << 20;

// Walks the vocabulary trie from the state `tops`: a token is allowed when every one of its bytes is.
std::shared_ptr<const TokenMask> compute_mask(const Grammar& grammar, const Vocabulary& vocabulary,
                                              std::vector<StackNode>& pool, const std::vector<int32_t>& tops,
                                              std::vector<std::vector<int32_t>>& levels, std::vector<size_t>& marks) {
  auto mask = std::make_shared<TokenMask>();
  mask->bits.assign((size_t(vocabulary.size()) + 63) / 64, 0);
  ByteMatcher matcher(grammar, pool);
  mask->can_end = std::any_of(tops.begin(), tops.end(), [&](int32_t top) { return matcher.can_end(top); });
  const size_t base = pool.size();
  levels.resize(size_t(vocabulary.longest()) + 1);
  marks.resize(levels.size());
  levels[0] = tops;
  marks[0] = base;
  const int32_t nodes = vocabulary.nodes();
  for (int32_t node = 1; node < nodes;) {
    const size_t depth = size_t(vocabulary.depth(node));
    pool.resize(marks[depth - 1]);
    matcher.feed_all(levels[depth - 1], vocabulary.byte(node), levels[depth]);
    if (levels[depth].empty()) {
      node = vocabulary.subtree_end(node);
      continue;
    }
    marks[depth] = pool.size();
    for (const int32_t* id = vocabulary.tokens_begin(node); id != vocabulary.tokens_end(node); ++id) {
      mask->bits[size_t(*id) / 64] |= uint64_t(1) << (*id % 64);
      ++mask->allowed;
    }
    ++node;
  }
  pool.resize(base);
  return mask;
}

class GrammarConstraint final : public engine::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocabulary)
      : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
    ByteMatcher matcher(*grammar_, pool_);
    tops_ = {matcher.start()};
  }

  bool mask(std::span<float> logits, std::span<const int32_t> end_tokens) override {
    const TokenMask& m = current();
    const size_t n = logits.size();
    saved_.clear();
    for (int32_t id : end_tokens) saved_.push_back(id >= 0 && size_t(id) < n ? logits[size_t(id)] : 0.0f);
    constexpr float kForbidden = -std::numeric_limits<float>::infinity();
    float* out = logits.data();
    const size_t covered = std::min(n, m.bits.size() * 64);
    for (size_t w = 0; w * 64 < covered; ++w) {
      const uint64_t bits = m.bits[w];
      const size_t begin = w * 64, end = std::min(begin + 64, covered);
      if (bits == ~uint64_t(0) && end - begin == 64) continue;
      if (bits == 0) {
        std::fill(out + begin, out + end, kForbidden);
        continue;
      }
      // Only the forbidden tokens' bits: few in a mostly-open state (inside a string).
      for (uint64_t forbidden = ~bits; forbidden != 0; forbidden &= forbidden - 1) {
        const size_t i = begin + size_t(std::countr_zero(forbidden));
        if (i < end) out[i] = kForbidden;
      }
    }
    std::fill(out + covered, out + n, kForbidden);
    bool end_allowed = false;
    for (size_t k = 0; k < end_tokens.size(); ++k) {
      const int32_t id = end_tokens[k];
      if (id < 0 || size_t(id) >= n) continue;
      logits[size_t(id)] = m.can_end ? saved_[k] : kForbidden;
      end_allowed |= m.can_end;
    }
    return m.allowed > 0 || end_allowed;
  }

  void accept(int32_t token) override {
    const TokenMask& m = current();
    if (token < 0 || token >= vocabulary_->size() || !((m.bits[size_t(token) / 64] >> (token % 64)) & 1))
      throw std::logic_error(fmt::format("grammar: token {} is not allowed here", token));
    ByteMatcher matcher(*grammar_, pool_);
    for (const char c : vocabulary_->bytes(token)) {
      matcher.feed_all(tops_, uint8_t(c), next_);
      tops_.swap(next_);
    }
    matcher.copy_stacks(tops_, fresh_);  // keep only the live stacks: the pool never grows with the output
    pool_.swap(fresh_);
    mask_.reset();
  }

  bool complete() override {
    const TokenMask& m = current();
    return m.can_end && m.allowed == 0;
  }

 private:
  const TokenMask& current() {
    if (mask_) return *mask_;
    ByteMatcher matcher(*grammar_, pool_);
    const std::string key = matcher.state_key(tops_, vocabulary_->longest());
    mask_ = grammar_->cached_mask(vocabulary_.get(), key);
    if (!mask_) {
      mask_ = compute_mask(*grammar_, *vocabulary_, pool_, tops_, levels_, marks_);
      grammar_->cache_mask(vocabulary_.get(), key, mask_);
    }
    return *mask_;
  }

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::vector<StackNode> pool_, fresh_;
  std::vector<int32_t> tops_, next_;
  std::shared_ptr<const TokenMask> mask_;
  std::vector<float> saved_;
  std::vector<std::vector<int32_t>> levels_;
  std::vector<size_t> marks_;
};

}  // namespace

Grammar::~Grammar() {
  if (ledger_ && cached_bytes_ > 0) ledger_->release(kLedgerAccount, cached_bytes_);
}

std::shared_ptr<const TokenMask> Grammar::cached_mask(const Vocabulary* vocabulary, const std::string& key) const {
  std::lock_guard lock(mutex_);
  if (vocabulary != cached_for_) return nullptr;
  const auto it = masks_.find(key);
  return it == masks_.end() ? nullptr : it->second;
}

void Grammar::cache_mask(const Vocabulary* vocabulary, const std::string& key,
                         std::shared_ptr<const TokenMask> mask) const {
  std::lock_guard lock(mutex_);
  if (vocabulary != cached_for_) {
    if (ledger_ && cached_bytes_ > 0) ledger_->release(kLedgerAccount, cached_bytes_);
    masks_.clear();
    cached_bytes_ = 0;
    cached_for_ = vocabulary;
    ledger_ = vocabulary->ledger();
  }
  const uint64_t bytes = mask->bits.size() * sizeof(uint64_t) + key.size() + 64;
  if (cached_bytes_ + bytes > kMaxCachedBytesPerGrammar) return;  // full: later states are computed each time
  if (ledger_ && !ledger_->try_charge(kLedgerAccount, bytes)) return;
  cached_bytes_ += bytes;
  masks_.emplace(key, std::move(mask));
}

std::unique_ptr<engine::TokenConstraint> make_constraint(std::shared_ptr<const Grammar> grammar,
                                                         std::shared_ptr<const Vocabulary> vocabulary) {
  if (!grammar || !vocabulary) throw std::invalid_argument("make_constraint: a grammar and a vocabulary are needed");
  return std::make_unique<GrammarConstraint>(std::move(grammar), std::move(vocabulary));
}

}  // namespace tierlm::grammar
