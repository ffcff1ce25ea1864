// Streamed tool calls on the wire equal the non-streamed response: model outputs in real families' formats go through
// AssistantOutputParser byte by byte and each writer's stream (OpenAI chat chunks: a header chunk with id, type and
// name, then argument pieces; Anthropic input_json_delta pieces; Responses function_call_arguments deltas), and what
// a client reassembles from the events equals the full body's calls. argument_pieces splits at top-level members.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "server/anthropic_messages.h"
#include "server/assistant_output.h"
#include "server/completion_writer.h"
#include "server/responses_api.h"

namespace tierlm::server {
namespace {

namespace json = boost::json;

TEST(StreamedToolCalls, ArgumentPiecesAreTopLevelMembers) {
  const std::string args = R"({"a":1,"b":{"c":[1,2],"d":"x,y"},"e":"q\",}","f":[{"g":","}]})";
  const std::vector<std::string> pieces = argument_pieces(args);
  EXPECT_EQ(pieces, (std::vector<std::string>{R"({"a":1,)", R"("b":{"c":[1,2],"d":"x,y"},)", R"("e":"q\",}",)",
                                              R"("f":[{"g":","}]})"}));
  EXPECT_EQ(argument_pieces("{}"), std::vector<std::string>{"{}"});
  EXPECT_EQ(argument_pieces(R"({"a":1})"), std::vector<std::string>{R"({"a":1})"});
  EXPECT_EQ(argument_pieces("[1,2]"), std::vector<std::string>{"[1,2]"});
}

struct Output {
  const char* name;
  ToolCallFormat format;
  std::string text;
};

// Outputs as the families' models write them (the templates' own renderings of calls).
const Output kOutputs[] = {
    {"qwen3_hermes", ToolCallFormat::hermes,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3, "
     "\"opts\": {\"unit\": \"c\", \"tags\": [\"a,b\", \"c\"]}}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculate\", "
     "\"arguments\": {\"expression\": \"2,3\"}}\n</tool_call>"},
    {"qwen3_5_xml", ToolCallFormat::qwen_xml,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n2\n"
     "</parameter>\n</function>\n</tool_call>"},
    {"gemma4", ToolCallFormat::gemma4,
     "<|tool_call>call:get_weather{city:<|\"|>Oslo, NO<|\"|>,days:2,opts:{unit:<|\"|>c<|\"|>}}<tool_call|>"},
    {"llama3_json", ToolCallFormat::llama3_json,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"days\": 1}}"},
    {"mistral", ToolCallFormat::mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\", \"days\": 5}"},
};

const json::array kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
   "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "calculate", "parameters": {"type": "object",
   "properties": {"expression": {"type": "string"}}}}}])").as_array();

AssistantOutputOptions options_for(ToolCallFormat format) {
  AssistantOutputOptions o;
  o.format = format;
  o.parse_tool_calls = true;
  o.tools = kTools;
  return o;
}

// (event name or "", data) for each SSE event.
std::vector<std::pair<std::string, json::value>> events(const std::string& sse) {
  std::vector<std::pair<std::string, json::value>> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    std::string block = sse.substr(pos, end - pos);
    pos = end + 2;
    std::string name;
    if (block.rfind("event: ", 0) == 0) {
      name = block.substr(7, block.find('\n') - 7);
      block = block.substr(block.find('\n') + 1);
    }
    const std::string data = block.substr(6);
    if (data != "[DONE]") out.emplace_back(name, json::parse(data));
  }
  return out;
}

// Drives a writer's stream with the parser fed byte by byte.
std::string stream(CompletionWriter& writer, const Output& o) {
  AssistantOutputParser parser(options_for(o.format));
  std::string sse = writer.stream_start(1);
  int calls = 0;
  for (size_t i = 0; i <= o.text.size(); ++i) {
    AssistantDelta d = i < o.text.size() ? parser.push(std::string_view(&o.text[i], 1)) : parser.finish();
    sse += writer.stream_delta(0, d, {}, calls);
    calls += int(d.tool_calls.size());
  }
  sse += writer.stream_choice_end(0, "tool_calls", "", Usage{1, 1, 0});
  return sse + writer.stream_end(Usage{1, 1, 0});
}

ResponseFormat::Choice whole(const Output& o) {
  ResponseFormat::Choice c;
  c.output = AssistantOutputParser::parse(o.text, options_for(o.format));
  c.finish_reason = "tool_calls";
  return c;
}

TEST(StreamedToolCalls, OpenAIChunksReassembleToTheFullResponse) {
  ResponseFormat format;
  format.id = "chatcmpl-1";
  format.model = "m";
  for (const Output& o : kOutputs) {
    SCOPED_TRACE(o.name);
    const json::value full = json::parse(make_openai_writer(format, false)->full({whole(o)}, "", {}));
    const json::array& expected = full.at("choices").at(0).at("message").at("tool_calls").as_array();
    ASSERT_FALSE(expected.empty());
    auto writer = make_openai_writer(format, true);
    std::map<int64_t, json::object> calls;
    std::map<int64_t, int> pieces;
    std::string content;
    for (const auto& [name, chunk] : events(stream(*writer, o))) {
      if (chunk.at("choices").as_array().empty()) continue;  // the usage chunk
      const json::object& delta = chunk.at("choices").at(0).at("delta").as_object();
      if (auto* c = delta.if_contains("content")) content += c->as_string();
      const json::value* tool_calls = delta.if_contains("tool_calls");
      if (!tool_calls) continue;
      ASSERT_EQ(tool_calls->as_array().size(), 1u);
      const json::object& piece = tool_calls->at(0).as_object();
      const int64_t index = piece.at("index").as_int64();
      json::object& call = calls[index];
      if (piece.contains("id")) {
        EXPECT_FALSE(call.contains("id")) << "one header chunk per call";
        EXPECT_EQ(piece.at("function").at("arguments"), json::value("")) << "the header carries no arguments";
        call["id"] = piece.at("id");
        call["type"] = piece.at("type");
        call["function"] = json::object{{"name", piece.at("function").at("name")}, {"arguments", ""}};
        continue;
      }
      ASSERT_TRUE(call.contains("id")) << "arguments before the call's header";
      ++pieces[index];
      json::string& args = call["function"].as_object()["arguments"].as_string();
      args.append(piece.at("function").at("arguments").as_string());
    }
    ASSERT_EQ(calls.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(json::value(calls[int64_t(i)]), expected[i]);
      EXPECT_EQ(pieces[int64_t(i)], int(argument_pieces(std::string(expected[i].at("function").at("arguments")
                                                                        .as_string())).size()));
    }
    const json::value& full_content = full.at("choices").at(0).at("message").at("content");
    EXPECT_EQ(content, full_content.is_null() ? "" : std::string(full_content.as_string()));
  }
}

TEST(StreamedToolCalls, AnthropicAndResponsesReassembleToTheFullBody) {
  for (const Output& o : kOutputs) {
    SCOPED_TRACE(o.name);
    const ResponseFormat::Choice c = whole(o);
    // Anthropic: each tool_use block's input_json_delta pieces join to the full body's input.
    const json::value message = json::parse(make_anthropic_writer("m", 1)->full({c}, "", {}));
    json::array expected_inputs;
    for (const auto& b : message.at("content").as_array())
      if (b.at("type").as_string() == "tool_use") expected_inputs.push_back(b.at("input"));
    auto anthropic = make_anthropic_writer("m", 1);
    std::map<int64_t, std::string> partial;
    for (const auto& [name, data] : events(stream(*anthropic, o)))
      if (name == "content_block_delta" && data.at("delta").at("type").as_string() == "input_json_delta")
        partial[data.at("index").as_int64()] += data.at("delta").at("partial_json").as_string();
    json::array inputs;
    for (const auto& [index, text] : partial) inputs.push_back(json::parse(text));
    EXPECT_EQ(inputs, expected_inputs);
    // Responses: function_call_arguments deltas join to each function_call item's arguments.
    auto echo = parse_responses_request(R"({"input": "x"})").echo;
    const json::value response = json::parse(make_responses_writer("m", echo)->full({c}, "", {}));
    std::vector<std::string> expected_args;
    for (const auto& item : response.at("output").as_array())
      if (item.at("type") == "function_call") expected_args.emplace_back(item.at("arguments").as_string());
    auto responses = make_responses_writer("m", echo);
    std::map<int64_t, std::string> deltas;
    for (const auto& [name, data] : events(stream(*responses, o)))
      if (name == "response.function_call_arguments.delta")
        deltas[data.at("output_index").as_int64()] += data.at("delta").as_string();
    std::vector<std::string> args;
    for (const auto& [index, text] : deltas) args.push_back(text);
    EXPECT_EQ(args, expected_args);
  }
}

}  // namespace
}  // namespace tierlm::server
