#include "runtime/tokenizer/tokenizer.h"

#include <boost/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "runtime/tokenizer/added_vocabulary.h"
#include "runtime/tokenizer/bpe_model.h"
#include "runtime/tokenizer/decoder.h"
#include "runtime/tokenizer/json_util.h"
#include "runtime/tokenizer/normalizer.h"
#include "runtime/tokenizer/pre_tokenizer.h"
#include "runtime/tokenizer/utf8.h"

namespace tierlm::tok {

using namespace detail;

namespace {

// What the post-processor adds around a single sequence when add_special_tokens is set.
struct SpecialWrap {
  std::vector<int32_t> prefix, suffix;
};

void add_post_processor(const boost::json::value& json, const std::string& where, SpecialWrap& wrap) {
  if (json.is_null()) return;
  const auto& o = json_object(json, where);
  const std::string type = json_required_string(o, "type", where);
  if (type == "ByteLevel") return;  // only trims offsets, which tierlm does not track
  if (type == "Sequence") {
    const auto* list = json_find(o, "processors");
    if (list == nullptr) json_fail(where, "Sequence without 'processors'");
    const auto& array = json_array(*list, where + ".processors");
    for (std::size_t i = 0; i < array.size(); ++i)
      add_post_processor(array[i], where + ".processors[" + std::to_string(i) + "]", wrap);
    return;
  }
  if (type == "TemplateProcessing") {
    const auto* single = json_find(o, "single");
    if (single == nullptr) json_fail(where, "TemplateProcessing without 'single'");
    const auto* specials_value = json_find(o, "special_tokens");
    const boost::json::object empty;
    const auto& specials = specials_value ? json_object(*specials_value, where + ".special_tokens") : empty;
    const auto& items = json_array(*single, where + ".single");
    bool seen_sequence = false;
    SpecialWrap inner;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::string at = where + ".single[" + std::to_string(i) + "]";
      const auto& item = json_object(items[i], at);
      if (json_find(item, "Sequence") != nullptr) {
        if (seen_sequence) json_fail(at, "a single-sequence template with two sequences");
        seen_sequence = true;
        continue;
      }
      const auto* special = json_find(item, "SpecialToken");
      if (special == nullptr) json_fail(at, "expected Sequence or SpecialToken");
      const std::string name = json_required_string(json_object(*special, at + ".SpecialToken"), "id", at);
      const auto* entry = json_find(specials, name);
      if (entry == nullptr) json_fail(at, "special token '" + name + "' missing from special_tokens");
      const auto* ids = json_find(json_object(*entry, where + ".special_tokens." + name), "ids");
      if (ids == nullptr) json_fail(where + ".special_tokens." + name, "missing 'ids'");
      auto& target = seen_sequence ? inner.suffix : inner.prefix;
      for (const auto& id : json_array(*ids, where + ".special_tokens." + name + ".ids"))
        target.push_back(static_cast<int32_t>(json_integer(id, where + ".special_tokens." + name + ".ids")));
    }
    wrap.prefix.insert(wrap.prefix.end(), inner.prefix.begin(), inner.prefix.end());
    wrap.suffix.insert(wrap.suffix.begin(), inner.suffix.begin(), inner.suffix.end());
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto token_id = [&](std::string_view key) {
      const auto* v = json_find(o, key);
      if (v == nullptr) json_fail(where, "missing '" + std::string(key) + "'");
      const auto& pair = json_array(*v, where + "." + std::string(key));
      if (pair.size() != 2) json_fail(where + "." + std::string(key), "expected [token, id]");
      return static_cast<int32_t>(json_integer(pair[1], where + "." + std::string(key) + "[1]"));
    };
    wrap.prefix.push_back(token_id("cls"));
    wrap.suffix.insert(wrap.suffix.begin(), token_id("sep"));
    return;
  }
  json_fail(where, "unsupported post_processor type '" + type + "'");
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path.string() + ": cannot open");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return std::move(buffer).str();
}

boost::json::value parse_json_file(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  boost::system::error_code error;
  boost::json::value value = boost::json::parse(text, error);
  if (error) throw TokenizerError(path.string() + ": invalid JSON: " + error.message());
  return value;
}

// tokenizer_config.json's bos_token / eos_token: a string or an AddedToken object with "content".
std::optional<std::string> config_token(const boost::json::object& config, std::string_view key) {
  const auto* v = json_find(config, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return std::string(v->get_string());
  if (v->is_object()) {
    if (const auto* content = json_find(v->get_object(), "content"); content && content->is_string())
      return std::string(content->get_string());
  }
  return std::nullopt;
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  SpecialWrap wrap;
  std::optional<int32_t> bos;
  std::vector<int32_t> eos;
  int32_t size = 0;

  std::optional<int32_t> find(std::string_view token) const {
    if (auto id = added.id_of(token)) return id;
    return model->token_to_id(token);
  }
};

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path, ec);
  const std::filesystem::path tokenizer_json = is_dir ? path / "tokenizer.json" : path;
  const std::filesystem::path dir = is_dir ? path : path.parent_path();
  if (!std::filesystem::exists(tokenizer_json, ec))
    throw TokenizerError(tokenizer_json.string() + ": not found");

  auto impl = std::make_shared<Impl>();
  try {
    const boost::json::value root_value = parse_json_file(tokenizer_json);
    const auto& root = json_object(root_value, "(root)");
    const boost::json::value null_value;
    auto member = [&](std::string_view key) -> const boost::json::value& {
      const auto* v = json_find(root, key);
      return v ? *v : null_value;
    };
    impl->normalizer = make_normalizer(member("normalizer"), "normalizer");
    impl->pre_tokenizer = make_pre_tokenizer(member("pre_tokenizer"), "pre_tokenizer");
    if (member("model").is_null()) json_fail("model", "missing");
    impl->model = std::make_unique<BpeModel>(member("model"), "model");
    impl->decoder = make_decoder(member("decoder"), "decoder");
    add_post_processor(member("post_processor"), "post_processor", impl->wrap);

    std::vector<AddedToken> added;
    if (const auto* list = json_find(root, "added_tokens")) {
      const auto& array = json_array(*list, "added_tokens");
      for (std::size_t i = 0; i < array.size(); ++i) {
        const std::string at = "added_tokens[" + std::to_string(i) + "]";
        const auto& o = json_object(array[i], at);
        AddedToken t;
        const long long id = json_required_integer(o, "id", at);
        // Added tokens follow the model's vocabulary (or reuse its ids); one far beyond it would make the vocabulary
        // size (one past the largest id) absurd, and INT32_MAX would overflow it.
        const int64_t id_limit = int64_t(impl->model->size()) + int64_t(array.size()) + kMaxIdHoles;
        if (id < 0 || id >= id_limit)
          json_fail(at + ".id", std::to_string(id) + " is out of range (ids must be below " +
                                    std::to_string(id_limit) + ")");
        t.id = static_cast<int32_t>(id);
        t.content = json_required_string(o, "content", at);
        t.special = json_bool(o, "special", false, at);
        t.lstrip = json_bool(o, "lstrip", false, at);
        t.rstrip = json_bool(o, "rstrip", false, at);
        t.normalized = json_bool(o, "normalized", !t.special, at);
        t.single_word = json_bool(o, "single_word", false, at);
        added.push_back(std::move(t));
      }
    }
    const Normalizer* normalizer = impl->normalizer.get();
    impl->added.build(std::move(added), [normalizer](std::string& text) {
      if (normalizer) normalizer->normalize(text);
    });
  } catch (const TokenizerError& e) {
    const std::string what = e.what();
    if (what.rfind(tokenizer_json.string(), 0) == 0) throw;
    throw TokenizerError(tokenizer_json.string() + ": " + what);
  } catch (const std::exception& e) {
    throw TokenizerError(tokenizer_json.string() + ": " + e.what());
  }
  impl->size = std::max(impl->model->size(), impl->added.max_id() + 1);

  // BOS/EOS names live beside tokenizer.json; both files are optional.
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) {
    const boost::json::value config_value = parse_json_file(config_path);
    if (!config_value.is_object()) throw TokenizerError(config_path.string() + ": expected a JSON object");
    const auto& config = config_value.get_object();
    if (const auto bos = config_token(config, "bos_token")) impl->bos = impl->find(*bos);
    if (const auto eos = config_token(config, "eos_token"))
      if (const auto id = impl->find(*eos)) impl->eos.push_back(*id);
  }
  const auto generation_path = dir / "generation_config.json";
  if (std::filesystem::exists(generation_path, ec)) {
    const boost::json::value generation = parse_json_file(generation_path);
    if (generation.is_object()) {
      if (const auto* eos = json_find(generation.get_object(), "eos_token_id")) {
        auto add = [&](const boost::json::value& v) {
          if (v.is_int64() && std::find(impl->eos.begin(), impl->eos.end(), v.get_int64()) == impl->eos.end())
            impl->eos.push_back(static_cast<int32_t>(v.get_int64()));
        };
        if (eos->is_array()) for (const auto& v : eos->get_array()) add(v);
        else add(*eos);
      }
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  std::string repaired;
  std::string_view text = input;
  if (!is_valid_utf8(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl.wrap.prefix;
  std::vector<Piece> pieces;
  for (const auto& raw : impl.added.split_raw(text)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string normalized(text.substr(raw.begin, raw.end - raw.begin));
    if (impl.normalizer) impl.normalizer->normalize(normalized);
    for (const auto& part : impl.added.split_normalized(normalized)) {
      if (part.id >= 0) {
        ids.push_back(part.id);
        continue;
      }
      pieces.clear();
      pieces.push_back({normalized.substr(part.begin, part.end - part.begin), raw.begin == 0 && part.begin == 0});
      if (impl.pre_tokenizer) impl.pre_tokenizer->pre_tokenize(pieces);
      for (const auto& piece : pieces) impl.model->encode_piece(piece.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), impl.wrap.suffix.begin(), impl.wrap.suffix.end());
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  std::string decoded = decode(std::span(&id, 1), false);
  if (decoded.find("\xEF\xBF\xBD") == std::string::npos) return decoded;  // whole characters: the text is the bytes
  const std::string piece = id_to_token(id);
  if (const int byte = byte_fallback_byte(piece); byte >= 0) return std::string(1, static_cast<char>(byte));
  std::string bytes;
  return byte_level_bytes(piece, bytes) ? bytes : decoded;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (const AddedToken* added = impl.added.by_id(id)) {
      if (!(skip_special_tokens && added->special)) tokens.push_back(added->content);
      continue;
    }
    const std::string* token = impl.model->id_to_token(id);
    if (token == nullptr || token->empty()) continue;  // unknown ids are dropped, as HF does
    tokens.push_back(*token);
  }
  if (!impl.decoder) {
    std::string joined;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined.push_back(' ');
      joined += tokens[i];
    }
    return joined;
  }
  impl.decoder->decode_chain(tokens);
  std::string joined;
  for (const auto& t : tokens) joined += t;
  return joined;
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->find(token).value_or(-1); }

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* added = impl_->added.by_id(id)) return added->content;
  const std::string* token = impl_->model->id_to_token(id);
  return token ? *token : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* added = impl_->added.by_id(id);
  return added != nullptr && added->special;
}

int32_t Tokenizer::vocab_size() const { return impl_->size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }

}  // namespace tierlm::tok
