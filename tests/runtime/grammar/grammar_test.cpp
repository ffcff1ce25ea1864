// The grammar engine against the JSON Schema spec: hand-made accept/reject cases over a one-byte-per-token
// vocabulary (each valid case per the spec and the whitespace policy of grammar.h), tool-call forms, unsupported
// keywords. grammar_walk_test.cpp checks real vocabularies against python3-jsonschema.
#include <gtest/gtest.h>

#include <cmath>

#include <boost/json.hpp>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/vocabulary.h"

namespace tierlm::grammar {
namespace {

namespace json = boost::json;
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
      {R"({"anyOf":[
            {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},
            {"type":"object","properties":{"ab":{"type":"string"}},"required":["ab"],"additionalProperties":false}]})",
       {R"({"a":1})", R"({"ab":"x"})"},
       {R"({"a":"x"})", R"({"ab":1})", R"({"abc":1})", "{}"}},
      {R"({"$defs":{"n":{"type":"object",
          "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},
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
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
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

}  // namespace
}  // namespace tierlm::grammar
