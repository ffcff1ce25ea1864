// The tool calls the Qwen3.5 and Gemma 4 chat templates write (the real templates, rendered by runtime/template, which
// chat_template_golden_test holds byte-identical to jinja2) parse back into the same calls: the format detected from
// each template's source reads the assistant turn it renders, whole and byte by byte, to the same names and
// arguments (as JSON values). This is the shape the models were trained to emit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <boost/json.hpp>

#include "runtime/template/chat_template.h"
#include "server/assistant_output.h"

namespace tierlm::server {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

const fs::path kSources = fs::path(TIERLM_SOURCE_DIR) / "tests" / "fixtures" / "templates" / "sources";

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const json::value kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"},
                                                   "days": {"type": "integer", "description": "Days"}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "book", "description": "Book a table",
   "parameters": {"type": "object", "properties": {
     "party": {"type": "object", "description": "Who", "properties": {"size": {"type": "integer"},
               "names": {"type": "array", "items": {"type": "string"}}}},
     "when": {"type": "string", "description": "Time"},
     "flexible": {"type": "boolean", "description": "Any time"},
     "budget": {"type": "number", "description": "Per person"}}, "required": ["party", "when"]}}}])");

const json::array kCalls = json::parse(R"([
  {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "São Paulo", "days": 2}}},
  {"id": "c2", "type": "function", "function": {"name": "book",
   "arguments": {"party": {"size": 4, "names": ["Ann", "Bo"]}, "when": "19:30", "flexible": false, "budget": 12.5}}}
])").as_array();

// The assistant turn `template_file` renders for kCalls, between the turn's opening and closing markers.
std::string rendered_turn(const std::string& source, const json::object& special, std::string_view open,
                          std::string_view close) {
  const tmpl::ChatTemplate t = tmpl::ChatTemplate::parse(source);
  json::array messages;
  messages.push_back(json::object{{"role", "user"}, {"content", "Weather in São Paulo, and book for four."}});
  messages.push_back(json::object{{"role", "assistant"}, {"content", ""}, {"tool_calls", kCalls}});
  const std::string text = tmpl::render_chat(t, messages, false, kTools, special, {{"enable_thinking", false}});
  const size_t begin = text.rfind(open);
  EXPECT_NE(begin, std::string::npos) << text;
  const size_t end = text.find(close, begin);
  EXPECT_NE(end, std::string::npos) << text;
  return text.substr(begin + open.size(), end - begin - open.size());
}

void expect_calls_parse(const std::string& source, ToolCallFormat format, const std::string& turn) {
  SCOPED_TRACE(turn);
  EXPECT_EQ(detect_tool_call_format(source), format);
  AssistantOutputOptions options;
  options.format = format;
  options.parse_tool_calls = true;
  options.split_reasoning = true;
  options.tools = kTools.as_array();
  const AssistantDelta whole = AssistantOutputParser::parse(turn, options);
  EXPECT_EQ(whole.content, "");
  ASSERT_EQ(whole.tool_calls.size(), kCalls.size());
  for (size_t i = 0; i < kCalls.size(); ++i) {
    EXPECT_EQ(whole.tool_calls[i].name, kCalls[i].at("function").at("name").as_string());
    EXPECT_EQ(json::parse(whole.tool_calls[i].arguments), kCalls[i].at("function").at("arguments"));
  }
  AssistantOutputParser streamed(options);
  AssistantDelta bytes;
  for (char c : turn) bytes.append(streamed.push(std::string_view(&c, 1)));
  bytes.append(streamed.finish());
  ASSERT_EQ(bytes.tool_calls.size(), whole.tool_calls.size());
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    EXPECT_EQ(bytes.tool_calls[i].name, whole.tool_calls[i].name);
    EXPECT_EQ(bytes.tool_calls[i].arguments, whole.tool_calls[i].arguments);
  }
  EXPECT_EQ(bytes.content, whole.content);
}

TEST(TemplateToolCalls, Qwen3_5CallsParseBack) {
  const std::string source = read(kSources / "qwen3_5.jinja");
  expect_calls_parse(source, ToolCallFormat::qwen_xml,
                     rendered_turn(source, {}, "<|im_start|>assistant\n", "<|im_end|>"));
}

TEST(TemplateToolCalls, Gemma4CallsParseBack) {
  const std::string source = read(kSources / "gemma4.jinja");
  expect_calls_parse(source, ToolCallFormat::gemma4,
                     rendered_turn(source, {{"bos_token", "<bos>"}}, "<|turn>model\n", "<turn|>"));
}

}  // namespace
}  // namespace tierlm::server
