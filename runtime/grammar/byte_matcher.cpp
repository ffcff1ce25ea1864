#include "runtime/grammar/byte_matcher.h"

#include <algorithm>

namespace tierlm::grammar {

namespace {
constexpr int32_t kMaxIntegerDigits = 15;
constexpr int32_t kMaxFractionDigits = 15;
constexpr int32_t kMaxExponentDigits = 3;

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// Counts one more character: exactly while a maximum applies, else saturating at the minimum (all that matters).
int32_t one_more(const Node& n, int32_t count) { return n.max >= 0 ? count + 1 : std::min(count + 1, n.min); }
bool has_room(const Node& n, int32_t count) { return n.max < 0 || count < n.max; }

// Continuation bytes after a UTF-8 lead byte: how many, and the range the first of them must fall in (no overlong
// forms, no surrogates, nothing past U+10FFFF). 0: not a valid lead byte.
int32_t utf8_continuation(uint8_t lead, uint8_t& lo, uint8_t& hi) {
  lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 1;
  if (lead == 0xE0) { lo = 0xA0; return 2; }
  if (lead == 0xED) { hi = 0x9F; return 2; }
  if (lead >= 0xE1 && lead <= 0xEF) return 2;
  if (lead == 0xF0) { lo = 0x90; return 3; }
  if (lead >= 0xF1 && lead <= 0xF3) return 3;
  if (lead == 0xF4) { hi = 0x8F; return 3; }
  return 0;
}
int32_t pack_utf8(int32_t remaining, uint8_t lo, uint8_t hi) { return remaining | (lo << 8) | (hi << 16); }
}  // namespace

int32_t ByteMatcher::push(const Frame& frame, int32_t parent) {
  pool_.push_back({frame, parent});
  return int32_t(pool_.size() - 1);
}

int32_t ByteMatcher::start() { return push({grammar_.root, 0, 0, 0}, kEmptyStack); }

// A value of `node` begins with `byte`, under `parent`.
void ByteMatcher::enter(int32_t node, int32_t parent, uint8_t byte, std::vector<int32_t>& out) {
  const Node& n = grammar_.nodes[size_t(node)];
  if (n.kind == NodeKind::choice) {
    for (int32_t alternative : n.children) enter(alternative, parent, byte, out);
    return;
  }
  feed(push({node, 0, 0, 0}, parent), byte, out);
}

void ByteMatcher::feed(int32_t top, uint8_t b, std::vector<int32_t>& out) {
  if (top == kEmptyStack) return;  // complete: nothing may follow
  const Frame f = pool_[size_t(top)].frame;
  const int32_t parent = pool_[size_t(top)].parent;
  const Node& n = grammar_.nodes[size_t(f.node)];
  switch (n.kind) {
    case NodeKind::literal:
      if (uint8_t(n.bytes[size_t(f.phase)]) != b) return;
      if (size_t(f.phase) + 1 == n.bytes.size()) out.push_back(parent);
      else out.push_back(push({f.node, f.phase + 1, 0, 0}, parent));
      return;
    case NodeKind::string: return feed_string(f, n, parent, b, out);
    case NodeKind::number: return feed_number(f, n, parent, b, out);
    case NodeKind::object: return feed_object(f, n, parent, b, out);
    case NodeKind::map: return feed_map(f, n, parent, b, out);
    case NodeKind::array: return feed_array(f, n, parent, b, out);
    case NodeKind::member: {
      const int32_t key_end = int32_t(n.bytes.size());
      if (f.phase < key_end) {
        if (uint8_t(n.bytes[size_t(f.phase)]) == b) out.push_back(push({f.node, f.phase + 1, 0, 0}, parent));
        return;
      }
      if (f.phase == key_end && b == ' ') {
        out.push_back(push({f.node, f.phase + 1, 0, 0}, parent));
        return;
      }
      return enter(n.children[0], parent, b, out);
    }
    case NodeKind::choice:  // never pushed (enter() goes straight to the alternatives); handled for completeness
      for (int32_t alternative : n.children) enter(alternative, parent, b, out);
      return;
    case NodeKind::sequence: {
      const size_t i = size_t(f.phase);
      if (i + 1 == n.children.size()) return enter(n.children[i], parent, b, out);
      return enter(n.children[i], push({f.node, f.phase + 1, 0, 0}, parent), b, out);
    }
    case NodeKind::repeat:
      if (f.phase == 0) return enter(n.children[0], push({f.node, 1, 0, 0}, parent), b, out);
      return enter(n.children[1], push({f.node, 0, 0, 0}, parent), b, out);
  }
}

void ByteMatcher::feed_string(const Frame& f, const Node& n, int32_t parent, uint8_t b, std::vector<int32_t>& out) {
  switch (f.phase) {
    case 0:
      if (b == '"') out.push_back(push({f.node, 1, 0, 0}, parent));
      return;
    case 1:
      if (b == '"') {
        if (f.count >= n.min) out.push_back(parent);
        return;
      }
      if (b < 0x20 || !has_room(n, f.count)) return;
      if (b == '\\') {
        out.push_back(push({f.node, 2, f.count, 0}, parent));
      } else if (b < 0x80) {
        out.push_back(push({f.node, 1, one_more(n, f.count), 0}, parent));
      } else {
        uint8_t lo, hi;
        if (const int32_t remaining = utf8_continuation(b, lo, hi))
          out.push_back(push({f.node, 3, one_more(n, f.count), pack_utf8(remaining, lo, hi)}, parent));
      }
      return;
    case 2:  // after a backslash
      if (b == 'u') {
        out.push_back(push({f.node, 4, f.count, 0}, parent));
      } else if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        out.push_back(push({f.node, 1, one_more(n, f.count), 0}, parent));
      }
      return;
    case 3: {  // UTF-8 continuation bytes
      const int32_t remaining = f.aux & 0xFF;
      const uint8_t lo = uint8_t((f.aux >> 8) & 0xFF), hi = uint8_t((f.aux >> 16) & 0xFF);
      if (b < lo || b > hi) return;
      if (remaining == 1) out.push_back(push({f.node, 1, f.count, 0}, parent));
      else out.push_back(push({f.node, 3, f.count, pack_utf8(remaining - 1, 0x80, 0xBF)}, parent));
      return;
    }
    case 4:  // \u hex digits; aux = digits so far
      if (!is_hex(b) || (f.aux == 0 && (b == 'd' || b == 'D'))) return;
      if (f.aux == 3) out.push_back(push({f.node, 1, one_more(n, f.count), 0}, parent));
      else out.push_back(push({f.node, 4, f.count, f.aux + 1}, parent));
      return;
  }
}

// Phases: 0 start, 1 after '-', 2 integer digits*, 3 a leading zero*, 4 after '.', 5 fraction digits*, 6 after 'e',
// 7 after the exponent's sign, 8 exponent digits* (*: the number may end here). count: digits of the current part.
void ByteMatcher::feed_number(const Frame& f, const Node& n, int32_t parent, uint8_t b, std::vector<int32_t>& out) {
  auto to = [&](int32_t phase, int32_t count) { out.push_back(push({f.node, phase, count, 0}, parent)); };
  const bool fraction_ok = !n.integer;
  switch (f.phase) {
    case 0:
      if (b == '-') to(1, 0);
      else if (b == '0') to(3, 0);
      else if (is_digit(b)) to(2, 1);
      return;
    case 1:
      if (b == '0') to(3, 0);
      else if (is_digit(b)) to(2, 1);
      return;
    case 2:
    case 3:
      if (f.phase == 2 && is_digit(b) && f.count < kMaxIntegerDigits) to(2, f.count + 1);
      else if (b == '.' && fraction_ok) to(4, 0);
      else if ((b == 'e' || b == 'E') && fraction_ok) to(6, 0);
      break;
    case 4:
      if (is_digit(b)) to(5, 1);
      return;
    case 5:
      if (is_digit(b) && f.count < kMaxFractionDigits) to(5, f.count + 1);
      else if (b == 'e' || b == 'E') to(6, 0);
      break;
    case 6:
      if (b == '+' || b == '-') to(7, 0);
      else if (is_digit(b)) to(8, 1);
      return;
    case 7:
      if (is_digit(b)) to(8, 1);
      return;
    case 8:
      if (is_digit(b) && f.count < kMaxExponentDigits) to(8, f.count + 1);
      break;
  }
  // A complete number also ends before any byte its parent takes.
  feed(parent, b, out);
}

// Phases: 0 before '{', 1 after '{', 2 after a member, 3 after ',', 4 after ", ". count: the first member that may
// still come (members come in schema order).
void ByteMatcher::feed_object(const Frame& f, const Node& n, int32_t parent, uint8_t b, std::vector<int32_t>& out) {
  const int32_t members = int32_t(n.children.size());
  auto may_close = [&] {
    for (int32_t j = f.count; j < members; ++j)
      if (n.required[size_t(j)]) return false;
    return true;
  };
  auto next_member = [&] {  // every member that may come next: up to and including the first required one
    for (int32_t j = f.count; j < members; ++j) {
      enter(n.children[size_t(j)], push({f.node, 2, j + 1, 0}, parent), b, out);
      if (n.required[size_t(j)]) break;
    }
  };
  switch (f.phase) {
    case 0:
      if (b == '{') out.push_back(push({f.node, 1, 0, 0}, parent));
      return;
    case 1:
      if (b == '}' && may_close()) out.push_back(parent);
      else if (b == '"') next_member();
      return;
    case 2:
      if (b == ',' && f.count < members) out.push_back(push({f.node, 3, f.count, 0}, parent));
      else if (b == '}' && may_close()) out.push_back(parent);
      return;
    case 3:
      if (b == ' ') out.push_back(push({f.node, 4, f.count, 0}, parent));
      else if (b == '"') next_member();
      return;
    case 4:
      if (b == '"') next_member();
      return;
  }
}

// Phases: 0 before '{', 1 after '{', 2 after a value, 3 after ',', 4 after ", ", 5 after a key, 6 after ':',
// 7 after ": ".
void ByteMatcher::feed_map(const Frame& f, const Node& n, int32_t parent, uint8_t b, std::vector<int32_t>& out) {
  auto key = [&] { enter(n.children[1], push({f.node, 5, 0, 0}, parent), b, out); };
  auto value = [&] { enter(n.children[0], push({f.node, 2, 0, 0}, parent), b, out); };
  switch (f.phase) {
    case 0:
      if (b == '{') out.push_back(push({f.node, 1, 0, 0}, parent));
      return;
    case 1:
      if (b == '}') out.push_back(parent);
      else if (b == '"') key();
      return;
    case 2:
      if (b == ',') out.push_back(push({f.node, 3, 0, 0}, parent));
      else if (b == '}') out.push_back(parent);
      return;
    case 3:
      if (b == ' ') out.push_back(push({f.node, 4, 0, 0}, parent));
      else if (b == '"') key();
      return;
    case 4:
      if (b == '"') key();
      return;
    case 5:
      if (b == ':') out.push_back(push({f.node, 6, 0, 0}, parent));
      return;
    case 6:
      if (b == ' ') out.push_back(push({f.node, 7, 0, 0}, parent));
      else value();
      return;
    case 7:
      value();
      return;
  }
}

// Phases: 0 before '[', 1 after '[', 2 after an item, 3 after ',', 4 after ", ". count: items so far (saturating at
// min when there is no max).
void ByteMatcher::feed_array(const Frame& f, const Node& n, int32_t parent, uint8_t b, std::vector<int32_t>& out) {
  auto item = [&](int32_t count) { enter(n.children[0], push({f.node, 2, count, 0}, parent), b, out); };
  switch (f.phase) {
    case 0:
      if (b == '[') out.push_back(push({f.node, 1, 0, 0}, parent));
      return;
    case 1:
      if (b == ']') {
        if (n.min == 0) out.push_back(parent);
      } else if (n.max != 0) {
        item(one_more(n, 0));
      }
      return;
    case 2:
      if (b == ',' && has_room(n, f.count)) out.push_back(push({f.node, 3, f.count, 0}, parent));
      else if (b == ']' && f.count >= n.min) out.push_back(parent);
      return;
    case 3:
      if (b == ' ') out.push_back(push({f.node, 4, f.count, 0}, parent));
      else item(one_more(n, f.count));
      return;
    case 4:
      item(one_more(n, f.count));
      return;
  }
}

bool ByteMatcher::can_end(int32_t top) const {
  while (top != kEmptyStack) {
    const Frame& f = pool_[size_t(top)].frame;
    const Node& n = grammar_.nodes[size_t(f.node)];
    const bool open_ended = (n.kind == NodeKind::number && (f.phase == 2 || f.phase == 3 || f.phase == 5 ||
                                                            f.phase == 8)) ||
                            (n.kind == NodeKind::repeat && f.phase == 1);
    if (!open_ended) return false;
    top = pool_[size_t(top)].parent;
  }
  return true;
}

bool ByteMatcher::same_stack(int32_t a, int32_t b) const {
  while (a != b) {
    if (a == kEmptyStack || b == kEmptyStack) return false;
    const Frame& x = pool_[size_t(a)].frame;
    const Frame& y = pool_[size_t(b)].frame;
    if (x.node != y.node || x.phase != y.phase || x.count != y.count || x.aux != y.aux) return false;
    a = pool_[size_t(a)].parent;
    b = pool_[size_t(b)].parent;
  }
  return true;
}

void ByteMatcher::feed_all(const std::vector<int32_t>& tops, uint8_t byte, std::vector<int32_t>& out) {
  out.clear();
  for (int32_t top : tops) feed(top, byte, out);
  if (out.size() < 2) return;
  size_t kept = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    bool duplicate = false;
    for (size_t j = 0; j < kept && !duplicate; ++j) duplicate = same_stack(out[i], out[j]);
    if (!duplicate) out[kept++] = out[i];
  }
  out.resize(kept);
}

std::string ByteMatcher::state_key(const std::vector<int32_t>& tops, int32_t horizon) const {
  std::string key;
  for (int32_t top : tops) {
    for (int32_t at = top; at != kEmptyStack; at = pool_[size_t(at)].parent) {
      Frame f = pool_[size_t(at)].frame;
      const Node& n = grammar_.nodes[size_t(f.node)];
      if (n.kind == NodeKind::string) {
        const int32_t needed = std::min(std::max(n.min - f.count, 0), horizon + 1);
        const int32_t room = n.max < 0 ? 0 : std::min(n.max - f.count, horizon + 1);
        f.count = needed * 65536 + room;
      }
      key.append(reinterpret_cast<const char*>(&f), sizeof f);
    }
    key.push_back('|');
  }
  return key;
}

void ByteMatcher::copy_stacks(std::vector<int32_t>& tops, std::vector<StackNode>& fresh) const {
  fresh.clear();
  std::vector<Frame> frames;
  for (int32_t& top : tops) {
    frames.clear();
    for (int32_t at = top; at != kEmptyStack; at = pool_[size_t(at)].parent) frames.push_back(pool_[size_t(at)].frame);
    int32_t parent = kEmptyStack;
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      fresh.push_back({*it, parent});
      parent = int32_t(fresh.size() - 1);
    }
    top = parent;
  }
}

}  // namespace tierlm::grammar
