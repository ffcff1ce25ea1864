// runtime/grammar/byte_matcher.h — runs a Grammar over bytes. A state is a set of stacks of frames (one per way the
// bytes so far can be read: anyOf branches, optional members), kept as persistent linked stacks in a pool so that
// feeding a byte only appends new top frames; the token-mask walk feeds a whole trie of tokens and rolls the pool
// back on each branch.
// Owns: nothing but the pool it is given. Never: allocates per byte beyond the pool and the output vector.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/grammar/grammar_nodes.h"

namespace tierlm::grammar {

struct Frame {
  int32_t node = 0;
  int32_t phase = 0;
  int32_t count = 0;
  int32_t aux = 0;
};

struct StackNode {
  Frame frame;
  int32_t parent = -1;
};

inline constexpr int32_t kEmptyStack = -1;  // every frame done: the text is complete

class ByteMatcher {
 public:
  ByteMatcher(const Grammar& grammar, std::vector<StackNode>& pool) : grammar_(grammar), pool_(pool) {}

  // The start state's single stack.
  int32_t start();
  // Appends to `out` the top of every stack that `top` becomes after `byte` (none: the byte is refused).
  void feed(int32_t top, uint8_t byte, std::vector<int32_t>& out);
  // Feeds `byte` to every stack in `tops`, into `out` (cleared first), without duplicate stacks.
  void feed_all(const std::vector<int32_t>& tops, uint8_t byte, std::vector<int32_t>& out);
  // True when the stack may end here (only complete numbers and finished repeats left open).
  bool can_end(int32_t top) const;
  // A byte string naming the state (the frames of every stack), the key of the mask cache. A string's character
  // count only matters within `horizon` (the longest token, in bytes) of its minimum or maximum length, so counts
  // farther away share one key.
  std::string state_key(const std::vector<int32_t>& tops, int32_t horizon) const;
  // Copies the stacks `tops` into `fresh` (a new pool) and rewrites `tops` to point there.
  void copy_stacks(std::vector<int32_t>& tops, std::vector<StackNode>& fresh) const;

 private:
  int32_t push(const Frame& frame, int32_t parent);
  void enter(int32_t node, int32_t parent, uint8_t byte, std::vector<int32_t>& out);
  void feed_string(const Frame& f, const Node& n, int32_t parent, uint8_t byte, std::vector<int32_t>& out);
  void feed_number(const Frame& f, const Node& n, int32_t parent, uint8_t byte, std::vector<int32_t>& out);
  void feed_object(const Frame& f, const Node& n, int32_t parent, uint8_t byte, std::vector<int32_t>& out);
  void feed_map(const Frame& f, const Node& n, int32_t parent, uint8_t byte, std::vector<int32_t>& out);
  void feed_array(const Frame& f, const Node& n, int32_t parent, uint8_t byte, std::vector<int32_t>& out);
  bool same_stack(int32_t a, int32_t b) const;

  const Grammar& grammar_;
  std::vector<StackNode>& pool_;
};

}  // namespace tierlm::grammar
