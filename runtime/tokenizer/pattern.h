// Pattern: what HF calls a SplitPattern / ReplacePattern: either a literal string or an Oniguruma regex; yields the
// byte ranges of its non-overlapping matches, leftmost first.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/tokenizer/regex.h"

namespace tierlm::tok::detail {

class Pattern {
 public:
  Pattern(bool is_regex, std::string text)
      : literal_(std::move(text)), regex_(is_regex ? std::make_shared<Regex>(literal_) : nullptr) {}

  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const {
    if (regex_) return regex_->find_all(text);
    std::vector<std::pair<std::size_t, std::size_t>> matches;
    if (literal_.empty()) return matches;
    for (std::size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size()))
      matches.emplace_back(pos, pos + literal_.size());
    return matches;
  }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

}  // namespace tierlm::tok::detail
