// AddedVocabulary: tokenizer.json's added_tokens, matched in the text before the model runs, as HF's
// AddedVocabulary does: tokens with normalized=false are found in the raw text first (leftmost-longest), then tokens
// with normalized=true are found in the normalized remainder; lstrip/rstrip/single_word are honoured. Also owns the
// id <-> content map of added tokens and which are special (for skip_special_tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlm::tok::detail {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// A cut of the input: either an added token (id >= 0) or text for the normalizer/model (id < 0).
struct Segment {
  std::size_t begin, end;
  int32_t id;
};

class AddedVocabulary {
 public:
  // `normalize` rewrites the patterns of normalized=true tokens the way the text will be rewritten.
  template <class NormalizeFn>
  void build(std::vector<AddedToken> tokens, NormalizeFn&& normalize) {
    tokens_ = std::move(tokens);
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      const auto& t = tokens_[i];
      by_id_[t.id] = i;
      by_content_[t.content] = t.id;
      if (t.normalized) {
        std::string pattern = t.content;
        normalize(pattern);
        normalized_trie_.insert(pattern, static_cast<int32_t>(i));
      } else {
        raw_trie_.insert(t.content, static_cast<int32_t>(i));
      }
    }
  }

  // Cuts `text` at the non-normalized added tokens.
  std::vector<Segment> split_raw(std::string_view text) const { return split(text, raw_trie_); }
  // Cuts already-normalized `text` at the normalized added tokens.
  std::vector<Segment> split_normalized(std::string_view text) const { return split(text, normalized_trie_); }

  const AddedToken* by_id(int32_t id) const;
  std::optional<int32_t> id_of(std::string_view content) const;
  bool empty() const { return tokens_.empty(); }
  int32_t max_id() const;

 private:
  // Byte trie for leftmost-longest matching of the token contents.
  class Trie {
   public:
    void insert(std::string_view pattern, int32_t token_index);
    // Longest pattern starting at text[pos]: returns its token index and sets `length`, or -1.
    int32_t longest_at(std::string_view text, std::size_t pos, std::size_t& length) const;
    bool empty() const { return nodes_.size() <= 1; }

   private:
    struct Node {
      int32_t token_index = -1;
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    };
    int32_t child(int32_t node, unsigned char byte) const;
    std::vector<Node> nodes_{Node{}};
  };

  std::vector<Segment> split(std::string_view text, const Trie& trie) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, std::size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  Trie raw_trie_, normalized_trie_;
};

}  // namespace tierlm::tok::detail
