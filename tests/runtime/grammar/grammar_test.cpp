// The grammar engine against the JSON Schema spec: hand-made accept/reject cases over a one-byte-per-token
// vocabulary, unsupported keywords, and random walks over the real Qwen3 (byte-level BPE) and Gemma-3
// (SentencePiece) vocabularies whose every finished output python3-jsonschema must validate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <boost/json.hpp>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/vocabulary.h"
#include "runtime/tokenizer/tokenizer.h"

namespace tierlm::grammar {
namespace {

namespace json = boost::json;
const std::filesystem::path kSource = TIERLM_SOURCE_DIR;
constexpr int32_t kEnd = 256;  // the end token of the byte vocabulary (beyond it: ids 0..255 are the bytes)

std::shared_ptr<const Vocabulary> byte_vocabulary() {
  static const auto vocabulary = [] {
    std::vector<std::string> bytes(256);
    for (int b = 0; b < 256; ++b) bytes[size_t(b)] = std::string(1, char(b));
    return std::make_shared<const Vocabulary>(std::move(bytes), nullptr);
  }();
  return vocabulary;
}

// True when `text`, one byte per token, is allowed all the way and the end token is allowed after it; the end
// token must be refused before (except where a prefix is itself a complete value, given in `complete_prefixes`).
bool accepts(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  auto constraint = make_constraint(grammar, byte_vocabulary());
  const int32_t end[1] = {kEnd};
  std::vector<float> logits(kEnd + 1);
  for (const char c : text) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    if (!constraint->mask(logits, end)) return false;
    if (std::isinf(logits[uint8_t(c)])) return false;
    constraint->accept(uint8_t(c));
  }
  std::fill(logits.begin(), logits.end(), 0.0f);
  constraint->mask(logits, end);
  return !std::isinf(logits[kEnd]);
}

std::shared_ptr<const Grammar> schema(std::string_view text) { return compile_json_schema(json::parse(text)); }

struct Case {
  const char* schema;
  std::vector<const char*> valid;
  std::vector<const char*> invalid;
};

TEST(Grammar, AcceptsValidAndRejectsInvalidDocuments) {
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name"],
          "additionalProperties":false})",
       {R"({"name":"Ann","age":31})", R"({"name": "Ann", "age": -4})", R"({"name":""})", R"({"name":"\u00e9\n"})",
        "{\"name\":\"caf\xC3\xA9\"}"},
       {R"({"age":31})", R"({"name":"Ann","age":3.5})", R"({"name":"Ann","extra":1})", R"({"age":1,"name":"A"})",
        R"({"name":"Ann",})", R"({ "name":"Ann"})", R"({"name":"Ann"} )", R"({"name":"a\x"})",
        R"({"name":"\ud800"})", "{\"name\":\"\xC3\"}", "{\"name\":\"\xED\xA0\x80\"}", "{\"name\":\"a\nb\"}",
        R"({"name":"Ann","age":012})", R"({"name":"Ann","age":-})"}},
      {R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3})",
       {"[1]", "[1,2.5,-0.5e3]", "[1, 2, 3]", "[0.25E+2]"},
       {"[]", "[1,2,3,4]", "[1,]", "[.5]", "[1.]", "[1e]", "[01]", "[1 ]"}},
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")", R"("abc")", "\"\xE2\x82\xAC\xE2\x82\xAC\"", R"("a\"")"},
       {R"("a")", R"("abcd")", R"("")"}},
      {R"({"enum":["red","green",3,null,{"a":[1,2]}]})",
       {R"("red")", R"("green")", "3", "null", R"({"a":[1,2]})"},
       {R"("blue")", "4", R"("re")", R"({"a":[1]})", "33"}},
      {R"({"const":"x"})", {R"("x")"}, {R"("y")", "\"x\"\"\""}},
      {R"({"type":["integer","null"]})", {"0", "-12", "null"}, {"1.5", "nul", "true"}},
      {R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},
                    {"type":"object","properties":{"ab":{"type":"string"}},"required":["ab"],"additionalProperties":false}]})",
       {R"({"a":1})", R"({"ab":"x"})"},
       {R"({"a":"x"})", R"({"ab":1})", R"({"abc":1})", "{}"}},
      {R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},
          "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/n"})",
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"},
       {R"({"kids":[]})", R"({"v":1,"kids":[{}]})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", R"({"x":1,"y": 2})", R"({"x": 1, "y": 2})"},
       {R"({"x":"1"})", R"({"x":1,})"}},
      {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},
          "required":["c"],"additionalProperties":false})",
       {R"({"c":3})", R"({"a":1,"c":3})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"},
       {R"({"a":1})", R"({"c":3,"a":1})", R"({"a":1,"a":1,"c":3})"}},
      {"{}", {R"({"a":[1,{"b":null}],"c":"d"})", "[]", "3.5", R"("s")", "true"}, {"{a:1}", "[1,]", "tru"}},
  };
  for (const auto& c : cases) {
    const auto g = schema(c.schema);
    for (const char* doc : c.valid) EXPECT_TRUE(accepts(g, doc)) << c.schema << "\n  should accept " << doc;
    for (const char* doc : c.invalid) EXPECT_FALSE(accepts(g, doc)) << c.schema << "\n  should reject " << doc;
  }
}

TEST(Grammar, JsonObjectIsAnyObject) {
  const auto g = compile_json_object();
  for (const char* doc : {"{}", R"({"a":{"b":[1,2,{"c":"d"}]},"e": false})"}) EXPECT_TRUE(accepts(g, doc)) << doc;
  for (const char* doc : {"[]", "1", R"("x")", "{", R"({"a":})"}) EXPECT_FALSE(accepts(g, doc)) << doc;
}

TEST(Grammar, ToolCallFormsWrapTheArguments) {
  const json::value weather = json::parse(
      R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false})");
  const json::value time = json::parse(R"({"type":"object","properties":{},"additionalProperties":false})");
  const ToolCallForm forms[] = {qwen_tool_call("get_weather", weather), qwen_tool_call("get_time", time)};
  const auto one = compile_tool_calls(forms);
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string other = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(accepts(one, call));
  EXPECT_TRUE(accepts(one, other));
  EXPECT_FALSE(accepts(one, call + "\n" + other));
  EXPECT_FALSE(accepts(one, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(one, "<tool_call>\n{\"name\": \"get_news\", \"arguments\": {}}\n</tool_call>"));
  const auto parallel = compile_tool_calls(forms, true, "\n");
  EXPECT_TRUE(accepts(parallel, call));
  EXPECT_TRUE(accepts(parallel, call + "\n" + other));
  EXPECT_FALSE(accepts(parallel, call + "\n"));
}

TEST(Grammar, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type":"integer","minimum":0})", "minimum"},
      {R"({"type":"string","pattern":"^a"})", "pattern"},
      {R"({"type":"string","format":"date"})", "format"},
      {R"({"type":"object","properties":{"a":{"type":"array","prefixItems":[]}}})", "prefixItems"},
      {R"({"type":"object","patternProperties":{}})", "patternProperties"},
      {R"({"type":"strange"})", "type"},
      {R"({"$ref":"http://example.com/s"})", "$ref"},
      {R"({"allOf":[{"type":"string"},{"maxLength":2}]})", "allOf"},
      {R"({"type":"object","anyOf":[{}]})", "anyOf"},
  };
  for (const auto& [text, keyword] : cases) {
    try {
      schema(text);
      ADD_FAILURE() << "compiled " << text;
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), keyword) << text << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(keyword), std::string::npos) << e.what();
    }
  }
}

// Random walks: at each step the mask must leave a way on (a token, or the end when the text is complete); the
// end is taken at random when allowed; finished outputs go to python3-jsonschema.
void random_walks(const std::string& tokenizer_name, int seeds_per_schema) {
  const auto dir = kSource / ".cache/tokenizers" / tokenizer_name;
  if (!std::filesystem::exists(dir / "tokenizer.json"))
    GTEST_SKIP() << dir << " is missing: run tools/fetch_tokenizers.sh";
  const auto tokenizer = tok::Tokenizer::load(dir);
  const auto vocabulary = build_vocabulary(tokenizer);
  std::ifstream in(kSource / "tests/runtime/grammar/schemas.json");
  std::stringstream text;
  text << in.rdbuf();
  const json::array schemas = json::parse(text.str()).as_array();
  const int32_t end_token = tokenizer.vocab_size();  // an id no grammar token has
  const int32_t ends[1] = {end_token};
  std::vector<float> logits(size_t(end_token) + 1);
  std::string lines;
  int finished = 0, walks = 0;
  for (const auto& s : schemas) {
    const auto g = compile_json_schema(s);
    for (int seed = 0; seed < seeds_per_schema; ++seed, ++walks) {
      std::mt19937 rng(uint32_t(seed * 7919 + walks));
      auto constraint = make_constraint(g, vocabulary);
      std::vector<int32_t> ids;
      bool done = false;
      for (int step = 0; step < 300 && !done; ++step) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        ASSERT_TRUE(constraint->mask(logits, ends)) << "no way on after " << tokenizer.decode(ids, false);
        std::vector<int32_t> allowed, structural;
        for (int32_t id = 0; id < end_token; ++id) {
          if (std::isinf(logits[size_t(id)])) continue;
          allowed.push_back(id);
          const std::string& b = vocabulary->bytes(id);
          if (b.find_first_of("\"]}0123456789tfn,") != std::string::npos && b.size() <= 3) structural.push_back(id);
        }
        const bool end_allowed = !std::isinf(logits[size_t(end_token)]);
        if (end_allowed && (allowed.empty() || rng() % 3 == 0)) {
          done = true;
          break;
        }
        ASSERT_FALSE(allowed.empty()) << "neither a token nor the end allowed after " << tokenizer.decode(ids, false);
        const auto& pool = (!structural.empty() && rng() % 4 != 0) ? structural : allowed;
        const int32_t id = pool[rng() % pool.size()];
        constraint->accept(id);
        ids.push_back(id);
        if (constraint->complete()) done = true;
      }
      if (!done) continue;
      ++finished;
      json::object line;
      line["schema"] = s;
      line["text"] = tokenizer.decode(ids, false);
      lines += json::serialize(line) + "\n";
    }
  }
  EXPECT_GE(finished, walks * 3 / 4) << "too few walks finished within 300 tokens";
  const auto path = std::filesystem::temp_directory_path() / ("grammar_walks_" + tokenizer_name + ".jsonl");
  std::ofstream(path) << lines;
  const std::string command =
      "python3 " + (kSource / "tests/runtime/grammar/validate_outputs.py").string() + " < " + path.string();
  const int status = std::system(command.c_str());
  std::filesystem::remove(path);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3-jsonschema missing";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "some outputs did not validate (see above)";
}

TEST(GrammarWalk, Qwen3ByteLevelVocabulary) { random_walks("qwen3", 6); }
TEST(GrammarWalk, Gemma3SentencePieceVocabulary) { random_walks("gemma3", 3); }

TEST(GrammarVocabulary, TokensDecodeToTheirBytes) {
  for (const char* name : {"qwen3", "gemma3"}) {
    const auto dir = kSource / ".cache/tokenizers" / name;
    if (!std::filesystem::exists(dir / "tokenizer.json")) GTEST_SKIP() << dir << " is missing";
    const auto tokenizer = tok::Tokenizer::load(dir);
    const auto vocabulary = build_vocabulary(tokenizer);
    // A text's tokens, mid-sentence, spell exactly the text (spaces and multi-byte characters included).
    const std::string text = "x {\"city\": \"S\xC3\xA3o Paulo\", \"temp\": -3.5} \xE4\xBD\xA0\xE5\xA5\xBD";
    const auto ids = tokenizer.encode(text, false);
    std::string spelled;
    for (int32_t id : ids) spelled += vocabulary->bytes(id);
    EXPECT_EQ(spelled, text) << name;
  }
}

}  // namespace
}  // namespace tierlm::grammar
