#include "runtime/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <vector>

#include "runtime/tokenizer/json_util.h"
#include "runtime/tokenizer/pattern.h"
#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok::detail {

namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(const std::string& form, const std::string& where) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") normalizer_ = icu::Normalizer2::getNFCInstance(status);
    else if (form == "NFKC") normalizer_ = icu::Normalizer2::getNFKCInstance(status);
    else if (form == "NFD") normalizer_ = icu::Normalizer2::getNFDInstance(status);
    else normalizer_ = icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status)) json_fail(where, "ICU has no " + form + " normalizer: " + u_errorName(status));
  }
  void normalize(std::string& text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
    if (normalizer_->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    normalizer_->normalizeUTF8(0, piece, sink, nullptr, status);
    if (U_SUCCESS(status)) text = std::move(out);
  }

 private:
  const icu::Normalizer2* normalizer_ = nullptr;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    const auto matches = pattern_.find_all(text);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size());
    std::size_t last = 0;
    for (const auto& [begin, end] : matches) {
      out.append(text, last, begin - last);
      out += content_;
      last = end;
    }
    out.append(text, last, std::string::npos);
    text = std::move(out);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text = prefix_ + text;  // (insert(0, ...) trips a GCC 12 -Wrestrict false positive)
  }

 private:
  std::string prefix_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    u.toLower(icu::Locale::getRoot());
    text.clear();
    u.toUTF8String(text);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    std::size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        std::size_t pos = begin;
        if (!is_whitespace(next_code_point(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        std::size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        std::size_t pos = start;
        if (!is_whitespace(next_code_point(text, pos))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (std::size_t pos = 0; pos < text.size();) {
      const char32_t cp = next_code_point(text, pos);
      if (u_charType(static_cast<UChar32>(cp)) != U_NON_SPACING_MARK) append_utf8(out, cp);
    }
    text = std::move(out);
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& part : parts_) part->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const boost::json::value& json, const std::string& where) {
  if (json.is_null()) return nullptr;
  const auto& o = json_object(json, where);
  const std::string type = json_required_string(o, "type", where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const auto* list = json_find(o, "normalizers");
    if (list == nullptr) json_fail(where, "Sequence without 'normalizers'");
    const auto& array = json_array(*list, where + ".normalizers");
    for (std::size_t i = 0; i < array.size(); ++i) {
      auto part = make_normalizer(array[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD")
    return std::make_unique<UnicodeNormalizer>(type, where);
  if (type == "Replace") {
    const auto* pattern = json_find(o, "pattern");
    if (pattern == nullptr) json_fail(where, "Replace without 'pattern'");
    const auto p = json_pattern(*pattern, where + ".pattern");
    return std::make_unique<ReplaceNormalizer>(Pattern(p.is_regex, p.text), json_required_string(o, "content", where));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_required_string(o, "prepend", where));
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(json_bool(o, "strip_left", true, where), json_bool(o, "strip_right", true, where));
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  json_fail(where, "unsupported normalizer type '" + type + "'");
}

}  // namespace tierlm::tok::detail
