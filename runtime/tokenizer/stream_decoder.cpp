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
std::string StreamDecoder::unseen_text(const std::string& text) const {
  if (text.compare(0, prefix_.size(), prefix_) == 0) return text.substr(prefix_.size());
  // Later tokens changed how the already-emitted context decodes: a byte-fallback run whose first bytes were valid
  // (and emitted) became invalid as a whole. Nothing is retracted; the new tokens are decoded on their own.
  return tokenizer_.decode(std::span(ids_).subspan(prefix_index_), skip_special_tokens_);
}

std::string StreamDecoder::step(int32_t id) {
  ids_.push_back(id);
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) return {};
  std::string fresh = unseen_text(text);
  const std::size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_.decode(ids_, skip_special_tokens_);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamDecoder::flush() {
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  std::string rest = prefix_index_ >= ids_.size() ? std::string() : unseen_text(text);
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace tierlm::tok
