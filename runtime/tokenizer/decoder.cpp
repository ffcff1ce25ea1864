#include "runtime/tokenizer/decoder.h"

#include "runtime/tokenizer/json_util.h"
#include "runtime/tokenizer/pattern.h"
#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok::detail {

namespace {

// Maps every token's characters back to bytes; a token with a character outside the byte alphabet (an added token
// such as "<｜User｜>") contributes its own UTF-8 bytes. The bytes are joined and repaired lossily.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    std::string mapped;
    for (const auto& token : tokens) bytes += byte_level_bytes(token, mapped) ? mapped : token;
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      const auto matches = pattern_.find_all(token);
      if (matches.empty()) continue;
      std::string out;
      std::size_t last = 0;
      for (const auto& [begin, end] : matches) {
        out.append(token, last, begin - last);
        out += content_;
        last = end;
      }
      out.append(token, last, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become their bytes when those form valid UTF-8, otherwise one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (std::size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (auto& token : tokens) {
      if (const int byte = byte_fallback_byte(token); byte >= 0) {
        run.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` (one character) from every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      std::size_t begin = 0, end = token.size();
      for (std::size_t n = 0; n < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++n)
        begin += content_.size();
      for (std::size_t n = 0; n < stop_ && end >= begin + content_.size() &&
                              token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++n)
        end -= content_.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  std::size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first_space)
      : replacement_(std::move(replacement)), strip_first_space_(strip_first_space) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    const Pattern pattern(false, replacement_);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      std::size_t last = 0;
      for (const auto& [begin, end] : pattern.find_all(tokens[i])) {
        out.append(tokens[i], last, begin - last);
        out.push_back(' ');
        last = end;
      }
      out.append(tokens[i], last, std::string::npos);
      if (i == 0 && strip_first_space_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_space_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& part : parts_) part->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const boost::json::value& json, const std::string& where) {
  if (json.is_null()) return nullptr;
  const auto& o = json_object(json, where);
  const std::string type = json_required_string(o, "type", where);
  if (type == "Sequence") {
    const auto* list = json_find(o, "decoders");
    if (list == nullptr) json_fail(where, "Sequence without 'decoders'");
    const auto& array = json_array(*list, where + ".decoders");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (std::size_t i = 0; i < array.size(); ++i) {
      auto part = make_decoder(array[i], where + ".decoders[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    const auto* pattern = json_find(o, "pattern");
    if (pattern == nullptr) json_fail(where, "Replace without 'pattern'");
    const auto p = json_pattern(*pattern, where + ".pattern");
    return std::make_unique<ReplaceDecoder>(Pattern(p.is_regex, p.text), json_required_string(o, "content", where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = json_required_string(o, "content", where);
    const long long start = json_required_integer(o, "start", where), stop = json_required_integer(o, "stop", where);
    if (start < 0 || stop < 0) json_fail(where, "negative start/stop");
    return std::make_unique<StripDecoder>(content, static_cast<std::size_t>(start), static_cast<std::size_t>(stop));
  }
  if (type == "Metaspace") {
    const std::string replacement = json_optional_string(o, "replacement", where).value_or("\xE2\x96\x81");
    bool strip = json_bool(o, "add_prefix_space", true, where);
    if (const auto scheme = json_optional_string(o, "prepend_scheme", where)) strip = *scheme != "never";
    return std::make_unique<MetaspaceDecoder>(replacement, strip);
  }
  json_fail(where, "unsupported decoder type '" + type + "'");
}

}  // namespace tierlm::tok::detail
