// tool_choice required / named: the grammar accepts, byte by byte, exactly the call blocks the chat template itself
// renders for an assistant's tool_calls (the oracle: the embedded default model's template and Qwen3's, rendered
// by runtime/template, byte-identical to transformers), and AssistantOutputParser reads them back as those calls.
// A function not allowed by the choice, or arguments off its schema, are refused; other formats are a 400.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "runtime/grammar/vocabulary.h"
#include "runtime/template/chat_template.h"
#include "server/api_error.h"
#include "server/tool_choice_constraint.h"

namespace tierlm::server {
namespace {

namespace json = boost::json;
const std::filesystem::path kSource = TIERLM_SOURCE_DIR;
constexpr int32_t kEndToken = 256;  // ids 0..255 are the bytes

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string tiny_template() { return read(kSource / "profiles/models/tierlm-tiny/chat_template.jinja"); }
std::string qwen3_template() {
  std::ifstream in(kSource / "tests/fixtures/templates/qwen3.jsonl");
  std::string first;
  std::getline(in, first);
  return std::string(json::parse(first).at("meta").at("template").as_string());
}

const json::array kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "book_table", "parameters": {"type": "object",
    "additionalProperties": false, "required": ["restaurant", "guests"],
    "properties": {"restaurant": {"type": "string"}, "guests": {"type": "integer"}}}}}])").as_array();

// The assistant turn's text from its first <tool_call> to its last </tool_call>, as the template renders the calls.
std::string rendered_calls(const std::string& source, const json::array& calls) {
  const auto chat_template = tmpl::ChatTemplate::parse(source);
  json::array messages{json::object{{"role", "user"}, {"content", "Book a table."}},
                       json::object{{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}}};
  const std::string text = tmpl::render_chat(chat_template, messages, false, kTools, {});
  const size_t begin = text.find("<tool_call>", text.rfind("<|im_start|>assistant")), end = text.rfind("</tool_call>");
  EXPECT_NE(begin, std::string::npos) << text;
  return text.substr(begin, end + 12 - begin);
}

json::object call(std::string_view name, std::string_view arguments) {
  return {{"type", "function"}, {"function", {{"name", name}, {"arguments", json::parse(arguments)}}}};
}

// Each byte of `text` is allowed in turn, and the end token after it.
bool walks(const std::shared_ptr<const grammar::Grammar>& g, std::string_view text) {
  std::vector<std::string> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[size_t(b)] = std::string(1, char(b));
  auto constraint = grammar::make_constraint(g, std::make_shared<const grammar::Vocabulary>(std::move(bytes), nullptr));
  const int32_t end[1] = {kEndToken};
  std::vector<float> logits(kEndToken + 1);
  for (const char c : text) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    if (!constraint->mask(logits, end) || std::isinf(logits[uint8_t(c)])) return false;
    constraint->accept(uint8_t(c));
  }
  std::fill(logits.begin(), logits.end(), 0.0f);
  constraint->mask(logits, end);
  return !std::isinf(logits[kEndToken]);
}

CompletionRequest request(ToolChoice choice, std::string name = {}, bool parallel = true) {
  CompletionRequest r;
  r.tools = kTools;
  r.tool_choice = choice;
  r.tool_choice_name = std::move(name);
  r.parallel_tool_calls = parallel;
  return r;
}

TEST(ToolChoiceConstraint, AcceptsTheTemplatesOwnCallsAndParsesThemBack) {
  for (const std::string& source : {tiny_template(), qwen3_template()}) {
    const ToolCallFormat format = detect_tool_call_format(source);
    ASSERT_EQ(format, ToolCallFormat::hermes);
    const json::object booking = call("book_table", R"({"restaurant": "Chez Paul", "guests": 4})");
    const json::object weather = call("get_weather", R"({"city": "Oslo"})");
    const std::string one = rendered_calls(source, {booking});
    const std::string two = rendered_calls(source, {booking, weather});

    const auto required_one = compile_tool_choice(tool_choice_spec(request(ToolChoice::required, {}, false), format),
                                                  source);
    EXPECT_TRUE(walks(required_one, one)) << one;
    EXPECT_FALSE(walks(required_one, two)) << "parallel_tool_calls false allows one call";
    const auto required = compile_tool_choice(tool_choice_spec(request(ToolChoice::required), format), source);
    // The template writes parallel calls back to back or one a line: the grammar's separator is a newline.
    const size_t joint = two.find("</tool_call><tool_call>");
    const std::string two_lines =
        joint == std::string::npos ? two : two.substr(0, joint + 12) + "\n" + two.substr(joint + 12);
    EXPECT_TRUE(walks(required, two_lines)) << two_lines;

    const auto named = compile_tool_choice(tool_choice_spec(request(ToolChoice::function, "get_weather"), format),
                                           source);
    EXPECT_FALSE(walks(named, one)) << "a call to another function";
    EXPECT_TRUE(walks(named, rendered_calls(source, {weather})));
    EXPECT_FALSE(walks(required, rendered_calls(source, {call("book_table", R"({"restaurant": "X"})")})))
        << "a required argument missing";
    EXPECT_FALSE(walks(required, rendered_calls(source, {call("order_taxi", R"({"city": "Oslo"})")})))
        << "a function not offered";

    AssistantOutputOptions options;
    options.format = format;
    options.parse_tool_calls = true;
    options.tools = kTools;
    const AssistantDelta parsed = AssistantOutputParser::parse(two_lines, options);
    ASSERT_EQ(parsed.tool_calls.size(), 2u) << two_lines;
    EXPECT_EQ(parsed.tool_calls[0].name, "book_table");
    EXPECT_EQ(json::parse(parsed.tool_calls[0].arguments), booking.at("function").at("arguments"));
    EXPECT_EQ(parsed.tool_calls[1].name, "get_weather");
    EXPECT_EQ(json::parse(parsed.tool_calls[1].arguments), weather.at("function").at("arguments"));
    EXPECT_TRUE(parsed.content.empty()) << parsed.content;
  }
}

TEST(ToolChoiceConstraint, OtherFormatsAndBadSchemasAre400) {
  for (const ToolCallFormat format : {ToolCallFormat::none, ToolCallFormat::qwen_xml, ToolCallFormat::gemma4}) {
    try {
      compile_tool_choice(tool_choice_spec(request(ToolChoice::required), format), tiny_template());
      ADD_FAILURE() << to_string(format);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "tool_choice");
      EXPECT_NE(std::string(e.what()).find(to_string(format)), std::string::npos) << e.what();
    }
  }
  CompletionRequest r = request(ToolChoice::required);
  r.tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0}}}}}])");
  try {
    compile_tool_choice(tool_choice_spec(r, ToolCallFormat::hermes), tiny_template());
    ADD_FAILURE() << "minimum compiled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(e.param().find("minimum"), std::string::npos) << e.param();
  }
}

// Llama-3.1's template writes a call as {"name": N, "parameters": A} (tojson's separators); Mistral's as
// [TOOL_CALLS]N[ARGS]A (v11+, templates with [ARGS]) or [TOOL_CALLS][{"name": N, "arguments": A}] (v3). One call
// per turn; the parser reads each back.
TEST(ToolChoiceConstraint, Llama3AndMistralForms) {
  struct Form {
    ToolCallFormat format;
    std::string source;  // what of the template's source picks the syntax
    std::string weather, booking;
  };
  const Form forms[] = {
      {ToolCallFormat::llama3_json, "<|python_tag|>", R"({"name": "get_weather", "parameters": {"city": "Oslo"}})",
       R"({"name": "book_table", "parameters": {"restaurant": "Chez Paul", "guests": 4}})"},
      {ToolCallFormat::mistral, "[TOOL_CALLS]{{ name }}[ARGS]", R"([TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"})",
       R"([TOOL_CALLS]book_table[ARGS]{"restaurant": "Chez Paul", "guests": 4})"},
      {ToolCallFormat::mistral, "[TOOL_CALLS] [", R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}])",
       R"([TOOL_CALLS][{"name": "book_table", "arguments": {"restaurant": "Chez Paul", "guests": 4}}])"},
  };
  for (const Form& f : forms) {
    SCOPED_TRACE(f.weather);
    const auto required = compile_tool_choice(tool_choice_spec(request(ToolChoice::required), f.format), f.source);
    EXPECT_TRUE(walks(required, f.weather));
    EXPECT_TRUE(walks(required, f.booking));
    EXPECT_FALSE(walks(required, f.weather + "\n" + f.booking)) << "one call per turn";
    const auto named = compile_tool_choice(tool_choice_spec(request(ToolChoice::function, "get_weather"), f.format),
                                           f.source);
    EXPECT_TRUE(walks(named, f.weather));
    EXPECT_FALSE(walks(named, f.booking)) << "a call to another function";
    AssistantOutputOptions options;
    options.format = f.format;
    options.parse_tool_calls = true;
    options.tools = kTools;
    const AssistantDelta parsed = AssistantOutputParser::parse(f.booking, options);
    ASSERT_EQ(parsed.tool_calls.size(), 1u) << f.booking;
    EXPECT_EQ(parsed.tool_calls[0].name, "book_table");
    EXPECT_EQ(json::parse(parsed.tool_calls[0].arguments), json::parse(R"({"restaurant": "Chez Paul", "guests": 4})"));
    EXPECT_TRUE(parsed.content.empty()) << parsed.content;
  }
  // A tokenizer whose [TOOL_CALLS] is a special token: the grammar cannot write it.
  ToolCallConstraintSpec spec = tool_choice_spec(request(ToolChoice::required), ToolCallFormat::mistral);
  spec.special_markers = {"[TOOL_CALLS]"};
  try {
    compile_tool_choice(spec, "[TOOL_CALLS]");
    ADD_FAILURE() << "a special marker compiled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "tool_choice");
    EXPECT_NE(std::string(e.what()).find("[TOOL_CALLS]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tierlm::server
