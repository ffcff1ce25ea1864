#include <utility>

#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::tok {

namespace {

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

// The window keeps the tokens of the previous emission as context, so decoders that treat the first token
// specially (Metaspace strips its leading space) decode the new tokens as they would inside the whole sequence;
// the new text is what the window decodes to beyond that context.
namespace {

// The part of `text` past what was already emitted as `prefix`. When later tokens changed how the context decodes
// (a byte-fallback run made invalid after its first bytes were emitted), nothing is retracted: the text past the
// common part is emitted.
std::string past_prefix(const std::string& text, const std::string& prefix) {
  std::size_t common = 0;
  while (common < prefix.size() && common < text.size() && text[common] == prefix[common]) ++common;
  if (common < prefix.size()) {
    while (common > 0 && (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) --common;  // whole characters
  }
  return text.substr(common);
}

}  // namespace

std::string StreamDecoder::step(int32_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) return {};
  std::string fresh = past_prefix(text, prefix_);
  const std::size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_.decode(ids_, skip_special_tokens_);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamDecoder::flush() {
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  std::string rest = text == prefix_ ? std::string() : past_prefix(text, prefix_);
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace tierlm::tok
