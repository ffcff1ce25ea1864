#include "runtime/tokenizer/regex.h"

#include <oniguruma.h>

#include <memory>
#include <mutex>

#include "runtime/tokenizer/tokenizer_error.h"
#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok::detail {

namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

struct RegionDeleter {
  void operator()(OnigRegion* region) const { onig_region_free(region, 1); }
};

}  // namespace

Regex::Regex(std::string_view pattern) {
  initialize_oniguruma();
  OnigErrorInfo error_info{};
  OnigRegex compiled = nullptr;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&compiled, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &error_info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &error_info);
    throw TokenizerError("bad regex '" + std::string(pattern) + "': " + reinterpret_cast<const char*>(message));
  }
  regex_ = compiled;
}

Regex::~Regex() {
  if (regex_ != nullptr) onig_free(static_cast<OnigRegex>(regex_));
}

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  std::unique_ptr<OnigRegion, RegionDeleter> region(onig_region_new());
  const auto* base = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = base + text.size();
  std::size_t start = 0;
  while (start <= text.size()) {
    const int rc = onig_search(static_cast<OnigRegex>(regex_), base, end, base + start, end, region.get(),
                               ONIG_OPTION_NONE);
    if (rc < 0) break;  // ONIG_MISMATCH (or an internal error: treat as no further match)
    const auto match_begin = static_cast<std::size_t>(region->beg[0]);
    const auto match_end = static_cast<std::size_t>(region->end[0]);
    if (match_end == match_begin) {
      // An empty match: step over one character so the search always advances.
      if (match_begin >= text.size()) break;
      start = match_begin + utf8_length(static_cast<unsigned char>(text[match_begin]));
      continue;
    }
    matches.emplace_back(match_begin, match_end);
    start = match_end;
  }
  return matches;
}

}  // namespace tierlm::tok::detail
