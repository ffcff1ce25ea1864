#include "runtime/grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include <spdlog/spdlog.h>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"
#include "tiering/ledger.h"

namespace tierlm::grammar {

namespace {

constexpr const char* kLedgerAccount = "grammar";

bool has_replacement_character(const std::string& text) { return text.find("\xEF\xBF\xBD") != std::string::npos; }

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> bytes, tiering::Ledger* ledger)
    : bytes_(std::move(bytes)), ledger_(ledger) {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < int32_t(bytes_.size()); ++id)
    if (!bytes_[size_t(id)].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] < bytes_[size_t(b)] || (bytes_[size_t(a)] == bytes_[size_t(b)] && a < b);
  });
  // Sorted strings give the trie's nodes in depth-first order: each string adds the nodes below its common prefix
  // with the one before.
  byte_.push_back(0);
  depth_.push_back(0);
  subtree_end_.push_back(0);
  std::vector<int32_t> path = {0};  // path[d]: the node at depth d of the previous string
  std::vector<std::pair<int32_t, int32_t>> ends;  // (node, token), in node order
  const std::string* previous = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[size_t(id)];
    longest_ = std::max(longest_, int32_t(s.size()));
    size_t common = 0;
    if (previous)
      while (common < s.size() && common < previous->size() && s[common] == (*previous)[common]) ++common;
    while (path.size() > common + 1) {
      subtree_end_[size_t(path.back())] = int32_t(byte_.size());
      path.pop_back();
    }
    for (size_t k = common; k < s.size(); ++k) {
      byte_.push_back(uint8_t(s[k]));
      depth_.push_back(uint16_t(std::min<size_t>(k + 1, 65535)));
      subtree_end_.push_back(0);
      path.push_back(int32_t(byte_.size() - 1));
    }
    ends.emplace_back(path.back(), id);
    previous = &s;
  }
  while (!path.empty()) {
    subtree_end_[size_t(path.back())] = int32_t(byte_.size());
    path.pop_back();
  }
  token_offset_.assign(byte_.size() + 1, 0);
  for (const auto& [node, id] : ends) ++token_offset_[size_t(node) + 1];
  std::partial_sum(token_offset_.begin(), token_offset_.end(), token_offset_.begin());
  token_ids_.resize(ends.size());
  for (size_t i = 0; i < ends.size(); ++i) token_ids_[i] = ends[i].second;  // already in node order

  charged_ = byte_.size() * (sizeof(uint8_t) + sizeof(uint16_t) + sizeof(int32_t) * 2) +
             token_ids_.size() * sizeof(int32_t);
  for (const auto& b : bytes_) charged_ += b.capacity() + sizeof(std::string);
  if (ledger_) ledger_->charge(kLedgerAccount, charged_);
}

Vocabulary::~Vocabulary() {
  if (ledger_) ledger_->release(kLedgerAccount, charged_);
}

std::shared_ptr<const Vocabulary> build_vocabulary(const tok::Tokenizer& tokenizer, tiering::Ledger* ledger) {
  const int32_t size = tokenizer.vocab_size();
  std::vector<std::string> bytes(size_t(std::max(size, 0)));
  std::vector<std::string> token(bytes.size());
  for (int32_t id = 0; id < size; ++id) token[size_t(id)] = tokenizer.id_to_token(id);
  // Byte-level vocabularies spell every ordinary token in the GPT-2 byte alphabet; SentencePiece ones use '▁'.
  int32_t spelled = 0, ordinary = 0;
  std::string scratch;
  for (int32_t id = 0; id < size; ++id) {
    if (token[size_t(id)].empty() || tokenizer.is_special(id)) continue;
    ++ordinary;
    spelled += tok::detail::byte_level_bytes(token[size_t(id)], scratch);
  }
  const bool byte_level = ordinary > 0 && spelled >= ordinary * 9 / 10;
  // SentencePiece decoders may drop a leading space at the start of the text: decode after a reference token and
  // keep what the token adds.
  int32_t reference = -1;
  std::string reference_text;
  if (!byte_level) {
    for (const char* probe : {"a", "x", "0", "."}) {
      const auto ids = tokenizer.encode(probe, false);
      if (ids.size() == 1 && tokenizer.decode(ids, false) == probe) {
        reference = ids[0];
        reference_text = probe;
        break;
      }
    }
  }
  int32_t skipped = 0;
  for (int32_t id = 0; id < size; ++id) {
    const std::string& t = token[size_t(id)];
    if (t.empty() || tokenizer.is_special(id)) continue;
    std::string& out = bytes[size_t(id)];
    if (byte_level && tok::detail::byte_level_bytes(t, out)) continue;
    out.clear();
    if (!byte_level) {
      if (const int b = tok::detail::byte_fallback_byte(t); b >= 0) {
        out.assign(1, char(b));
        continue;
      }
    }
    std::string text;
    if (reference >= 0) {
      const int32_t pair[2] = {reference, id};
      text = tokenizer.decode(pair, false);
      text = text.rfind(reference_text, 0) == 0 ? text.substr(reference_text.size())
                                                : tokenizer.decode({&id, 1}, false);
    } else {
      text = tokenizer.decode({&id, 1}, false);
    }
    if (has_replacement_character(text) && !has_replacement_character(t)) {
      ++skipped;  // bytes we cannot recover: never allowed
      continue;
    }
    out = std::move(text);
  }
  if (skipped > 0) spdlog::debug("[grammar] {} tokens have no recoverable bytes and are never allowed", skipped);
  return std::make_shared<Vocabulary>(std::move(bytes), ledger);
}

}  // namespace tierlm::grammar
