#include "runtime/tokenizer/pre_tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "runtime/tokenizer/json_util.h"
#include "runtime/tokenizer/pattern.h"
#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok::detail {

namespace {

using Range = std::pair<std::size_t, std::size_t>;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return Behavior::Removed;
  if (name == "Isolated") return Behavior::Isolated;
  if (name == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::MergedWithNext;
  if (name == "Contiguous") return Behavior::Contiguous;
  json_fail(where, "unsupported split behavior '" + name + "'");
}

struct Span {
  std::size_t begin, end;
  bool is_match;
};

// Cuts `length` bytes into the pieces HF's NormalizedString::split makes from the given matches.
std::vector<Range> split_ranges(std::size_t length, const std::vector<Range>& matches, Behavior behavior, bool invert) {
  std::vector<Span> spans;
  if (length == 0) {
    spans.push_back({0, 0, false});
  } else {
    std::size_t previous = 0;
    for (const auto& [begin, end] : matches) {
      if (begin != previous) spans.push_back({previous, begin, false});
      spans.push_back({begin, end, true});
      previous = end;
    }
    if (previous != length) spans.push_back({previous, length, false});
  }
  if (invert)
    for (auto& s : spans) s.is_match = !s.is_match;

  // After this, is_match means "drop this span".
  std::vector<Span> merged;
  switch (behavior) {
    case Behavior::Isolated:
      for (auto s : spans) merged.push_back({s.begin, s.end, false});
      break;
    case Behavior::Removed:
      merged = spans;
      break;
    case Behavior::Contiguous: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !merged.empty()) merged.back().end = s.end;
        else merged.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) merged.back().end = s.end;
        else merged.push_back({s.begin, s.end, false});
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) merged.back().begin = it->begin;
        else merged.push_back({it->begin, it->end, false});
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  std::vector<Range> out;
  for (const auto& s : merged)
    if (!s.is_match && s.end > s.begin) out.emplace_back(s.begin, s.end);
  return out;
}

// Replaces each piece by its sub-pieces; only the first sub-piece keeps at_start.
void split_pieces(std::vector<Piece>& pieces, const std::function<std::vector<Range>(const std::string&)>& cut) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) {
    const auto ranges = cut(piece.text);
    for (const auto& [begin, end] : ranges)
      out.push_back({piece.text.substr(begin, end - begin), piece.at_start && begin == 0});
  }
  pieces = std::move(out);
}

// Each code point for which `predicate` holds is one match (HF's `impl Pattern for Fn(char) -> bool`).
std::vector<Range> char_matches(const std::string& text, bool (*predicate)(char32_t)) {
  std::vector<Range> matches;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t begin = pos;
    if (predicate(next_code_point(text, pos))) matches.emplace_back(begin, pos);
  }
  return matches;
}

bool is_numeric(char32_t cp) {
  const auto type = u_charType(static_cast<UChar32>(cp));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const std::string& text) {
      return split_ranges(text.size(), pattern_.find_all(text), behavior_, invert_);
    });
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), regex_(use_regex ? std::make_unique<Pattern>(true, kGpt2Pattern) : nullptr) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (auto& piece : pieces)
        if (piece.text.empty() || piece.text[0] != ' ') piece.text = ' ' + piece.text;  // not insert(0, ...): GCC 12's false -Wrestrict
    if (regex_)
      split_pieces(pieces, [this](const std::string& text) {
        return split_ranges(text.size(), regex_->find_all(text), Behavior::Isolated, false);
      });
    const auto& alphabet = byte_level_alphabet();
    for (auto& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += alphabet.byte_to_utf8[static_cast<unsigned char>(c)];
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (auto& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ') replaced += replacement_;
        else replaced.push_back(c);
      }
      const bool prepend = scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && piece.at_start);
      if (prepend && replaced.compare(0, replacement_.size(), replacement_) != 0) replaced.insert(0, replacement_);
      piece.text = std::move(replaced);
    }
    if (split_) {
      const Pattern pattern(false, replacement_);
      split_pieces(pieces, [&pattern](const std::string& text) {
        return split_ranges(text.size(), pattern.find_all(text), Behavior::MergedWithNext, false);
      });
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const std::string& text) {
      return split_ranges(text.size(), char_matches(text, is_numeric),
                          individual_ ? Behavior::Isolated : Behavior::Contiguous, false);
    });
  }

 private:
  bool individual_;
};

class WhitespaceSplitPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [](const std::string& text) {
      return split_ranges(text.size(), char_matches(text, is_whitespace), Behavior::Removed, false);
    });
  }
};

class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  WhitespacePreTokenizer() : pattern_(true, R"(\w+|[^\w\s]+)") {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [this](const std::string& text) {
      return split_ranges(text.size(), pattern_.find_all(text), Behavior::Removed, true);
    });
  }

 private:
  Pattern pattern_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& part : parts_) part->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const boost::json::value& json, const std::string& where) {
  if (json.is_null()) return nullptr;
  const auto& o = json_object(json, where);
  const std::string type = json_required_string(o, "type", where);
  if (type == "Sequence") {
    const auto* list = json_find(o, "pretokenizers");
    if (list == nullptr) json_fail(where, "Sequence without 'pretokenizers'");
    const auto& array = json_array(*list, where + ".pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (std::size_t i = 0; i < array.size(); ++i) {
      auto part = make_pre_tokenizer(array[i], where + ".pretokenizers[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") {
    const auto* pattern = json_find(o, "pattern");
    if (pattern == nullptr) json_fail(where, "Split without 'pattern'");
    const auto p = json_pattern(*pattern, where + ".pattern");
    const Behavior behavior = parse_behavior(json_required_string(o, "behavior", where), where + ".behavior");
    try {
      return std::make_unique<SplitPreTokenizer>(Pattern(p.is_regex, p.text), behavior, json_bool(o, "invert", false, where));
    } catch (const TokenizerError& e) {
      json_fail(where + ".pattern", e.what());
    }
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(json_bool(o, "add_prefix_space", true, where),
                                                   json_bool(o, "use_regex", true, where));
  if (type == "Metaspace") {
    const std::string replacement = json_optional_string(o, "replacement", where).value_or("\xE2\x96\x81");
    PrependScheme scheme = json_bool(o, "add_prefix_space", true, where) ? PrependScheme::Always : PrependScheme::Never;
    if (const auto name = json_optional_string(o, "prepend_scheme", where)) {
      if (*name == "always") scheme = PrependScheme::Always;
      else if (*name == "first") scheme = PrependScheme::First;
      else if (*name == "never") scheme = PrependScheme::Never;
      else json_fail(where + ".prepend_scheme", "unsupported value '" + *name + "'");
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, json_bool(o, "split", true, where));
  }
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(json_bool(o, "individual_digits", false, where));
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  json_fail(where, "unsupported pre_tokenizer type '" + type + "'");
}

}  // namespace tierlm::tok::detail
