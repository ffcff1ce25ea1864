// Regex: a compiled Oniguruma pattern over UTF-8, with the same syntax and options HF tokenizers uses through the
// onig crate (ONIG_SYNTAX_DEFAULT, ONIG_OPTION_NONE), so \p{L}, (?i:...), \s+(?!\S) behave identically.
// Searching is const and thread-safe (each call owns its match region).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tierlm::tok::detail {

class Regex {
 public:
  explicit Regex(std::string_view pattern);  // throws TokenizerError with Oniguruma's message
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of the successive non-overlapping matches, leftmost first.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

 private:
  void* regex_ = nullptr;  // OnigRegex; kept opaque so oniguruma.h stays out of the headers
};

}  // namespace tierlm::tok::detail
