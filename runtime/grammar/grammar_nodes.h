// runtime/grammar/grammar_nodes.h — what a compiled Grammar is: a graph of byte-level nodes (literals, JSON
// strings and numbers, objects with ordered members, maps, arrays, choices, sequences, repeats) that the byte
// matcher walks with a stack of frames, plus the cache of token masks per matcher state.
// Owns: the nodes and the mask cache (guarded by a mutex; its bytes are charged to the vocabulary's ledger).
// Never: changes a node after compilation.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/grammar/grammar.h"

namespace tierlm::grammar {

enum class NodeKind : uint8_t {
  literal,   // bytes, exactly
  string,    // a JSON string of [min, max] characters (max < 0: unbounded)
  number,    // a JSON number (integer: no fraction or exponent)
  object,    // '{' members in order (children: member nodes, required[i]) '}'
  member,    // bytes (the quoted key and ':'), an optional space, then children[0]
  map,       // '{' any keys (children[1]: a string node) with values children[0] '}'
  array,     // '[' children[0] repeated [min, max] times, ',' separated ']'
  choice,    // one of children (never a frame of its own: entering it enters every alternative)
  sequence,  // children one after the other
  repeat,    // children[0], then (children[1] children[0])*; may end after any children[0]
};

struct Node {
  NodeKind kind = NodeKind::literal;
  std::string bytes;
  int32_t min = 0;
  int32_t max = -1;
  bool integer = false;
  std::vector<int32_t> children;
  std::vector<bool> required;
};

// Which tokens may come next in one matcher state: a bit per token id of the vocabulary (end tokens aside), how
// many are set, and whether the text may end there.
struct TokenMask {
  std::vector<uint64_t> bits;
  int64_t allowed = 0;
  bool can_end = false;
};

class Grammar {
 public:
  std::vector<Node> nodes;
  int32_t root = 0;  // a sequence node: the matcher's first frame

  ~Grammar();
  // The cached mask for a state key (see ByteMatcher::state_key), or null.
  std::shared_ptr<const TokenMask> cached_mask(const Vocabulary* vocabulary, const std::string& key) const;
  // Keeps `mask` while the cache has room (and the ledger allows it).
  void cache_mask(const Vocabulary* vocabulary, const std::string& key, std::shared_ptr<const TokenMask> mask) const;

 private:
  mutable std::mutex mutex_;
  mutable const Vocabulary* cached_for_ = nullptr;
  mutable tiering::Ledger* ledger_ = nullptr;
  mutable uint64_t cached_bytes_ = 0;
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenMask>> masks_;
};

}  // namespace tierlm::grammar
