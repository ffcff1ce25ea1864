// runtime/grammar/vocabulary.h — every token of a tokenizer as the bytes it decodes to, in a trie laid out in
// depth-first order, so the token-mask walk over 151k tokens is one forward scan that skips a whole subtree when
// the grammar refuses its first byte.
// Owns: the trie arrays (charged to the ledger's "grammar" account when a ledger is given).
// Never: includes special tokens (they are never grammar text; end tokens are handled by the constraint).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/grammar/grammar.h"

namespace tierlm::grammar {

class Vocabulary {
 public:
  // bytes[id]: the token's bytes, empty for a token the grammar never allows (special, or decoding to nothing).
  Vocabulary(std::vector<std::string> bytes, tiering::Ledger* ledger);
  ~Vocabulary();
  Vocabulary(const Vocabulary&) = delete;
  Vocabulary& operator=(const Vocabulary&) = delete;

  int32_t size() const { return int32_t(bytes_.size()); }  // token ids [0, size())
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  int32_t longest() const { return longest_; }             // bytes of the longest token
  tiering::Ledger* ledger() const { return ledger_; }

  // Trie nodes in depth-first order; node 0 is the root (no byte).
  int32_t nodes() const { return int32_t(byte_.size()); }
  uint8_t byte(int32_t node) const { return byte_[size_t(node)]; }
  int32_t depth(int32_t node) const { return depth_[size_t(node)]; }
  int32_t subtree_end(int32_t node) const { return subtree_end_[size_t(node)]; }  // one past its last descendant
  // Token ids whose bytes end exactly at `node`.
  const int32_t* tokens_begin(int32_t node) const { return token_ids_.data() + token_offset_[size_t(node)]; }
  const int32_t* tokens_end(int32_t node) const { return token_ids_.data() + token_offset_[size_t(node) + 1]; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<int32_t> subtree_end_;
  std::vector<int32_t> token_offset_;
  std::vector<int32_t> token_ids_;
  int32_t longest_ = 0;
  tiering::Ledger* ledger_ = nullptr;
  uint64_t charged_ = 0;
};

}  // namespace tierlm::grammar
