#include "runtime/tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok::detail {

namespace {

bool is_word_character(char32_t cp) { return cp == '_' || u_isalnum(static_cast<UChar32>(cp)); }

std::size_t previous_char_start(std::string_view text, std::size_t end) {
  std::size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char byte : pattern) {
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& kids = nodes_[static_cast<std::size_t>(node)].children;
      kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1})),
                  std::make_pair(byte, next));
    }
    node = next;
  }
  // The first token with a given content wins, as a hash map keyed by content would keep it.
  if (nodes_[static_cast<std::size_t>(node)].token_index < 0) nodes_[static_cast<std::size_t>(node)].token_index = token_index;
}

int32_t AddedVocabulary::Trie::child(int32_t node, unsigned char byte) const {
  const auto& kids = nodes_[static_cast<std::size_t>(node)].children;
  const auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
  return (it != kids.end() && it->first == byte) ? it->second : -1;
}

int32_t AddedVocabulary::Trie::longest_at(std::string_view text, std::size_t pos, std::size_t& length) const {
  int32_t node = 0, found = -1;
  for (std::size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[static_cast<std::size_t>(node)].token_index >= 0) {
      found = nodes_[static_cast<std::size_t>(node)].token_index;
      length = i + 1 - pos;
    }
  }
  return found;
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, const Trie& trie) const {
  std::vector<Segment> segments;
  if (trie.empty() || text.empty()) {
    segments.push_back({0, text.size(), -1});
    return segments;
  }
  std::size_t emitted = 0;  // end of the last segment pushed
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t length = 0;
    const int32_t index = trie.longest_at(text, pos, length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<std::size_t>(index)];
    std::size_t start = pos, stop = pos + length;
    pos = stop;  // matches never overlap, even when this one is rejected below
    if (token.single_word) {
      bool start_ok = true, stop_ok = true;
      if (start > 0) {
        std::size_t p = previous_char_start(text, start);
        start_ok = !is_word_character(next_code_point(text, p));
      }
      if (stop < text.size()) {
        std::size_t p = stop;
        stop_ok = !is_word_character(next_code_point(text, p));
      }
      if (!start_ok || !stop_ok) continue;
    }
    if (token.lstrip) {
      std::size_t new_start = start;
      while (new_start > emitted) {
        const std::size_t p0 = previous_char_start(text, new_start);
        std::size_t p = p0;
        if (!is_whitespace(next_code_point(text, p))) break;
        new_start = p0;
      }
      start = std::max(new_start, emitted);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        std::size_t p = stop;
        if (!is_whitespace(next_code_point(text, p))) break;
        stop = p;
      }
      pos = stop;
    }
    if (start > emitted) segments.push_back({emitted, start, -1});
    segments.push_back({start, stop, token.id});
    emitted = stop;
  }
  if (emitted < text.size()) segments.push_back({emitted, text.size(), -1});
  return segments;
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::id_of(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

int32_t AddedVocabulary::max_id() const {
  int32_t max = -1;
  for (const auto& t : tokens_) max = std::max(max, t.id);
  return max;
}

}  // namespace tierlm::tok::detail
