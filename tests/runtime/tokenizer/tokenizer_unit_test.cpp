// Unit tests on small hand-written tokenizer.json files (no downloaded vocabulary needed): SentencePiece-style BPE
// with byte fallback (Llama-2 layout), Metaspace, added-token flags, streaming of split characters, UTF-8 repair,
// and the load errors users see.
#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"

namespace {

using tierlm::tok::StreamDecoder;
using tierlm::tok::Tokenizer;
using tierlm::tok::TokenizerError;
namespace json = boost::json;

const std::string kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() / ("tierlm_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

json::object added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
                   bool single_word = false) {
  return {{"id", id}, {"content", content}, {"special", special}, {"lstrip", lstrip}, {"rstrip", rstrip},
          {"normalized", false}, {"single_word", single_word}};
}

// Llama-2 layout: <unk> <s> </s>, 256 byte tokens, then a few pieces and merges spelling "▁hello".
json::object llama2_style() {
  json::object vocab;
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const std::string& piece : std::vector<std::string>{kMeta, "h", "e", "l", "o", "a", "b", "x", kMeta + "h", "ll", kMeta + "he", "llo",
                                  kMeta + "hello"})
    vocab[piece] = next++;
  json::array merges = {json::array{kMeta, "h"}, json::array{"l", "l"}, json::array{kMeta + "h", "e"},
                        json::array{"ll", "o"}, json::array{kMeta + "he", "llo"}};
  json::object model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"fuse_unk", true},
                        {"byte_fallback", true}, {"vocab", vocab}, {"merges", merges}};
  json::object normalizer = {
      {"type", "Sequence"},
      {"normalizers", json::array{json::object{{"type", "Prepend"}, {"prepend", kMeta}},
                                  json::object{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}}}};
  json::object decoder = {
      {"type", "Sequence"},
      {"decoders", json::array{json::object{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                               json::object{{"type", "ByteFallback"}}, json::object{{"type", "Fuse"}},
                               json::object{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  json::object post = {
      {"type", "TemplateProcessing"},
      {"single", json::array{json::object{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                             json::object{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array{1}}, {"tokens", json::array{"<s>"}}}}}}};
  return {{"version", "1.0"},
          {"added_tokens", json::array{added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)}},
          {"normalizer", normalizer}, {"pre_tokenizer", nullptr}, {"post_processor", post}, {"decoder", decoder},
          {"model", model}};
}

int byte_id(unsigned char b) { return 3 + b; }

Tokenizer load_json(const TempDir& dir, const json::object& tokenizer, const std::string& config = "") {
  dir.write("tokenizer.json", json::serialize(tokenizer));
  if (!config.empty()) dir.write("tokenizer_config.json", config);
  return Tokenizer::load(dir.path());
}

TEST(TokenizerUnit, SentencePieceStyleBpeWithByteFallback) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, llama2_style(), R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  const int hello = tok.token_to_id(kMeta + "hello");
  ASSERT_GE(hello, 0);
  EXPECT_EQ(tok.encode("hello", false), (std::vector<int32_t>{hello}));
  EXPECT_EQ(tok.encode("hello", true), (std::vector<int32_t>{1, hello}));
  EXPECT_EQ(tok.encode("hello hello", false), (std::vector<int32_t>{hello, hello}));
  // é is not in the vocab: its UTF-8 bytes become <0xC3><0xA9>.
  const std::vector<int32_t> he_acute = {tok.token_to_id(kMeta + "h"), byte_id(0xC3), byte_id(0xA9)};
  EXPECT_EQ(tok.encode("h\xC3\xA9", false), he_acute);
  EXPECT_EQ(tok.decode(he_acute, false), "h\xC3\xA9");
  // Special tokens are matched in the raw text; every text segment gets its own "▁" from Prepend.
  EXPECT_EQ(tok.encode("<s>hello</s>", false), (std::vector<int32_t>{1, hello, 2}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, hello, 2}, false), "<s> hello</s>");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1, hello, 2}, true), "hello");
  // A lone invalid byte decodes to U+FFFD, one per byte of an invalid run.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{hello, byte_id(0xC3), byte_id(0x41)}, false), "hello\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok.encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_ids(), (std::vector<int32_t>{2}));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_EQ(tok.vocab_size(), 259 + 13);
  EXPECT_EQ(tok.token_to_id("nope"), -1);
  EXPECT_EQ(tok.id_to_token(99999), "");
}

TEST(TokenizerUnit, InvalidUtf8InputIsRepairedNotFatal) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, llama2_style());
  // "\xFF" becomes U+FFFD (EF BF BD), which is not in the vocab: three byte tokens.
  EXPECT_EQ(tok.encode("\xFF", false),
            (std::vector<int32_t>{tok.token_to_id(kMeta), byte_id(0xEF), byte_id(0xBF), byte_id(0xBD)}));
}

TEST(TokenizerUnit, AddedTokenFlags) {
  TempDir dir;
  json::object t = llama2_style();
  json::array tokens = t["added_tokens"].as_array();
  tokens.push_back(added(300, "<mask>", true, /*lstrip=*/true, /*rstrip=*/true));
  tokens.push_back(added(301, "[W]", false, false, false, /*single_word=*/true));
  t["added_tokens"] = tokens;
  const Tokenizer tok = load_json(dir, t);
  const int meta = tok.token_to_id(kMeta), ta = tok.token_to_id("a"), tb = tok.token_to_id("b"),
            tx = tok.token_to_id("x");
  // lstrip/rstrip swallow the spaces around <mask>: "a", <mask>, "b" each normalized on their own.
  EXPECT_EQ(tok.encode("a  <mask>  b", false), (std::vector<int32_t>{meta, ta, 300, meta, tb}));
  // single_word: only matched with no word character on either side.
  EXPECT_EQ(tok.encode("x[W]", false),
            (std::vector<int32_t>{meta, tx, byte_id('['), tok.token_to_id("<0x57>"), byte_id(']')}));
  EXPECT_EQ(tok.encode("x [W] x", false), (std::vector<int32_t>{meta, tx, meta, 301, meta, meta, tx}));
}

TEST(TokenizerUnit, MetaspacePreTokenizerAndDecoder) {
  TempDir dir;
  json::object t = llama2_style();
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  t["decoder"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  const Tokenizer tok = load_json(dir, t);
  const int hello = tok.token_to_id(kMeta + "hello");
  EXPECT_EQ(tok.encode("hello hello", false), (std::vector<int32_t>{hello, hello}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{hello, hello}, false), "hello hello");
}

TEST(TokenizerUnit, StreamDecoderHoldsBackSplitCharacters) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, llama2_style());
  StreamDecoder stream(tok);
  const int he = tok.token_to_id(kMeta + "h"), hello = tok.token_to_id(kMeta + "hello");
  EXPECT_EQ(stream.step(hello), "hello");
  EXPECT_EQ(stream.step(he), " h");
  // "€" = E2 82 AC arrives one byte token at a time: nothing until the character is whole.
  EXPECT_EQ(stream.step(byte_id(0xE2)), "");
  EXPECT_EQ(stream.step(byte_id(0x82)), "");
  EXPECT_EQ(stream.step(byte_id(0xAC)), "\xE2\x82\xAC");
  // A dangling lead byte is held, then flushed as U+FFFD.
  EXPECT_EQ(stream.step(byte_id(0xF0)), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  // After flush the decoder starts afresh (the first token's space is stripped again).
  EXPECT_EQ(stream.step(hello), "hello");
}

TEST(TokenizerUnit, Utf8LossyMatchesRust) {
  using tierlm::tok::detail::utf8_lossy;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("\xC3"), r);
  EXPECT_EQ(utf8_lossy("\xE2\x82" "A"), r + "A");          // truncated sequence: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), r);                // truncated 4-byte sequence
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);        // surrogate: ED's second byte is out of range
  EXPECT_EQ(utf8_lossy("\xC0\x80"), r + r);                // overlong lead byte
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(TokenizerUnit, LoadErrorsNameTheFileAndTheProblem) {
  TempDir dir;
  auto expect_error = [](const std::filesystem::path& path, const std::vector<std::string>& fragments) {
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const TokenizerError& e) {
      for (const auto& f : fragments)
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "'" << f << "' missing from: " << e.what();
    }
  };
  expect_error(dir.path() / "missing", {"missing", "not found"});
  expect_error(dir.write("broken.json", "{\"model\": "), {"broken.json", "invalid JSON"});
  expect_error(dir.write("array.json", "[]"), {"array.json", "expected an object"});

  json::object t = llama2_style();
  t["model"].as_object()["type"] = "Unigram";
  expect_error(dir.write("unigram.json", json::serialize(t)), {"unigram.json", "model.type", "Unigram"});
  t = llama2_style();
  t["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  expect_error(dir.write("bert.json", json::serialize(t)), {"bert.json", "pre_tokenizer", "BertPreTokenizer"});
  t = llama2_style();
  t["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error(dir.write("regex.json", json::serialize(t)), {"regex.json", "pre_tokenizer.pattern", "(unclosed"});
  t = llama2_style();
  t["model"].as_object()["merges"] = json::array{"h"};
  expect_error(dir.write("merges.json", json::serialize(t)), {"merges.json", "model.merges[0]"});
  t = llama2_style();
  t["decoder"] = {{"type", "WordPiece"}};
  expect_error(dir.write("wordpiece.json", json::serialize(t)), {"wordpiece.json", "decoder", "WordPiece"});
}

// Found with the tokenizer_json fuzz harness: one vocab entry with id 2^31-1 made load allocate 64 GiB (the id table),
// and an added token with that id overflowed the vocabulary size (INT32_MAX + 1). Both are load errors now, while a
// few holes in the numbering still load.
TEST(TokenizerUnit, IdsFarBeyondTheVocabularyAreLoadErrors) {
  TempDir dir;
  auto load_error = [&](const json::object& t) -> std::string {
    try {
      load_json(dir, t);
    } catch (const TokenizerError& e) {
      return e.what();
    }
    return "";
  };
  json::object t = llama2_style();
  t["model"].as_object()["vocab"].as_object()["zz"] = 2147483647;
  EXPECT_NE(load_error(t).find("model.vocab"), std::string::npos) << load_error(t);
  t = llama2_style();
  t["added_tokens"].as_array().push_back(added(2147483647, "<big>", true));
  EXPECT_NE(load_error(t).find("added_tokens[3].id"), std::string::npos) << load_error(t);
  t = llama2_style();
  t["model"].as_object()["vocab"].as_object()["zz"] = 1000;
  t["added_tokens"].as_array().push_back(added(5000, "<late>", true));
  const Tokenizer holes = load_json(dir, t);
  EXPECT_EQ(holes.vocab_size(), 5001);
  EXPECT_EQ(holes.token_to_id("zz"), 1000);
}

}  // namespace
