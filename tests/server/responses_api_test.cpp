// The Responses API decoder (body -> the normalized chat request the template sees) and writer (response object and
// the streamed event sequence), against the shapes OpenAI's API reference gives. The npm openai SDK's strict stream
// accumulator checks the same events end to end (tests/server/node/responses_test.mjs).
#include "server/responses_api.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

namespace tierlm::server {
namespace {

namespace json = boost::json;

void rejects(const std::string& body, const std::string& param) {
  try {
    parse_responses_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), param) << body << " -> " << e.what();
    return;
  }
  ADD_FAILURE() << "accepted: " << body;
}

TEST(ResponsesApi, StringInputAndInstructions) {
  const auto r = parse_responses_request(R"({"model": "m", "input": "Hi", "instructions": "Be brief.",
                                             "max_output_tokens": 32, "temperature": 0.5, "top_p": 0.9})");
  EXPECT_EQ(json::value(r.request.messages),
            json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])"));
  EXPECT_EQ(r.request.max_tokens, 32);
  EXPECT_FLOAT_EQ(r.request.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.request.sampling.top_p, 0.9f);
  EXPECT_EQ(r.request.model, "m");
  EXPECT_EQ(r.echo.at("instructions"), json::value("Be brief."));
  EXPECT_EQ(r.echo.at("max_output_tokens"), json::value(32));
  EXPECT_EQ(r.echo.at("text"), json::parse(R"({"format":{"type":"text"}})"));
}

TEST(ResponsesApi, FunctionCallRoundTripBecomesTheChatConversation) {
  // What a client sends back after running the tool: its input, the previous response's output items (reasoning,
  // a message, two calls) and the calls' outputs.
  const auto r = parse_responses_request(R"({
    "model": "m", "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false,
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}],
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris and Oslo?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Both."}]},
      {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
       "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
       "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
      {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "18 C"},
      {"type": "function_call_output", "call_id": "call_b", "output": "4 C"}]})");
  const CompletionRequest& q = r.request;
  EXPECT_EQ(q.endpoint, Endpoint::chat);
  EXPECT_EQ(q.tool_choice, ToolChoice::function);
  EXPECT_EQ(q.tool_choice_name, "get_weather");
  EXPECT_FALSE(q.parallel_tool_calls);
  EXPECT_EQ(q.tools, json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])"));
  EXPECT_EQ(json::value(q.messages), json::parse(R"([
      {"role":"system","content":"Use tools."},
      {"role":"user","content":"Paris and Oslo?"},
      {"role":"assistant","content":"Checking.","reasoning_content":"Both.",
       "tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}},
                     {"id":"call_b","type":"function","function":{"name":"get_weather","arguments":{"city":"Oslo"}}}]},
      {"role":"tool","tool_call_id":"call_a","content":"18 C","name":"get_weather"},
      {"role":"tool","tool_call_id":"call_b","content":"4 C","name":"get_weather"}])"));
  EXPECT_EQ(r.echo.at("tool_choice"), json::parse(R"({"type":"function","name":"get_weather"})"));
}

TEST(ResponsesApi, TextFormatJsonSchemaReachesTheGrammar) {
  const auto r = parse_responses_request(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "p",
      "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})");
  EXPECT_EQ(r.request.structured_output.kind, StructuredOutput::Kind::json_schema);
  EXPECT_EQ(r.request.structured_output.name, "p");
  EXPECT_TRUE(r.request.structured_output.strict);
  EXPECT_EQ(r.request.structured_output.schema, json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}}})"));
  EXPECT_EQ(parse_responses_request(R"({"input":"x","text":{"format":{"type":"json_object"}}})")
                .request.structured_output.kind, StructuredOutput::Kind::json_object);
}

TEST(ResponsesApi, RefusesStorageAndWhatItDoesNotImplement) {
  rejects(R"({"input": "x", "store": true})", "store");
  rejects(R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id");
  rejects(R"({"input": "x", "include": ["reasoning.encrypted_content"]})", "include");
  rejects(R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type");
  rejects(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
          "input[0].content[0].type");
  rejects(R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0].type");
  rejects(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]})",
          "input[0].arguments");
  rejects(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function",
             "name": "g"}})", "tool_choice");
  rejects(R"({"input": "x", "text": {"format": {"type": "grammar"}}})", "text.format.type");
  rejects(R"({"input": "x", "reasoning": {"summary": "auto"}})", "reasoning.summary");
  rejects(R"({"model": "m"})", "input");
  rejects(R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens");
  // store false is what tierlm does anyway.
  EXPECT_NO_THROW(parse_responses_request(R"({"input": "x", "store": false})"));
}

// Splits an SSE body into (event name, data object) pairs, checking each event's name equals its data's type and
// the sequence numbers count up from 0.
std::vector<std::pair<std::string, json::object>> events_of(const std::string& sse) {
  std::vector<std::pair<std::string, json::object>> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string block = sse.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(block.rfind("event: ", 0), 0u) << block;
    const size_t nl = block.find('\n');
    const std::string name = block.substr(7, nl - 7);
    EXPECT_EQ(block.compare(nl + 1, 6, "data: "), 0) << block;
    json::object data = json::parse(block.substr(nl + 7)).as_object();
    EXPECT_EQ(data.at("type").as_string(), name);
    EXPECT_EQ(data.at("sequence_number").as_int64(), int64_t(out.size()));
    out.emplace_back(name, std::move(data));
  }
  return out;
}

TEST(ResponsesApi, StreamingEventSequence) {
  auto writer = make_responses_writer("m", parse_responses_request(R"({"input": "x"})").echo);
  std::string sse = writer->stream_start(1);
  AssistantDelta a;
  a.reasoning = "Think";
  a.content = "Hel";
  sse += writer->stream_delta(0, a, {}, 0);
  AssistantDelta b;
  b.content = "lo";
  b.tool_calls.push_back(ToolCall{"call_0", "f", R"({"x":1})"});
  sse += writer->stream_delta(0, b, {}, 0);
  sse += writer->stream_choice_end(0, "tool_calls", "", Usage{5, 7, 0});
  sse += writer->stream_end(Usage{5, 7, 0});
  const auto events = events_of(sse);
  std::vector<std::string> names;
  for (const auto& [name, data] : events) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "response.created", "response.in_progress",
                       "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                       "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                       "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                       "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                       "response.output_item.done",
                       "response.output_item.added", "response.function_call_arguments.delta",
                       "response.function_call_arguments.done", "response.output_item.done",
                       "response.completed"}));
  EXPECT_EQ(events[0].second.at("response").at("status"), json::value("in_progress"));
  EXPECT_EQ(events[12].second.at("text"), json::value("Hello"));
  EXPECT_EQ(events[12].second.at("output_index"), json::value(1));
  const json::object& call_added = events[15].second.at("item").as_object();
  EXPECT_EQ(call_added.at("call_id"), json::value("call_0"));
  EXPECT_EQ(call_added.at("arguments"), json::value(""));
  EXPECT_EQ(events[17].second.at("arguments"), json::value(R"({"x":1})"));
  const json::object& done = events.back().second.at("response").as_object();
  EXPECT_EQ(done.at("status"), json::value("completed"));
  EXPECT_EQ(done.at("id"), events[0].second.at("response").at("id"));
  const json::array& output = done.at("output").as_array();
  ASSERT_EQ(output.size(), 3u);
  EXPECT_EQ(output[0].at("type"), json::value("reasoning"));
  EXPECT_EQ(output[1].at("content").at(0).at("text"), json::value("Hello"));
  EXPECT_EQ(output[1].at("id"), events[8].second.at("item").at("id"));
  EXPECT_EQ(output[2].at("type"), json::value("function_call"));
  EXPECT_EQ(done.at("usage").at("total_tokens"), json::value(12));
}

TEST(ResponsesApi, MaxOutputTokensEndsIncomplete) {
  auto writer = make_responses_writer("m", parse_responses_request(R"({"input": "x", "max_output_tokens": 2})").echo);
  std::string sse = writer->stream_start(1);
  AssistantDelta a;
  a.content = "ab";
  sse += writer->stream_delta(0, a, {}, 0);
  sse += writer->stream_choice_end(0, "length", "", Usage{1, 2, 0});
  sse += writer->stream_end(Usage{1, 2, 0});
  const auto events = events_of(sse);
  EXPECT_EQ(events.back().first, "response.incomplete");
  const json::value& r = events.back().second.at("response");
  EXPECT_EQ(r.at("status"), json::value("incomplete"));
  EXPECT_EQ(r.at("incomplete_details").at("reason"), json::value("max_output_tokens"));
  EXPECT_EQ(r.at("output").at(0).at("status"), json::value("incomplete"));
}

TEST(ResponsesApi, FullResponseObject) {
  auto writer = make_responses_writer("m", parse_responses_request(R"({"input": "x", "metadata": {"k": "v"}})").echo);
  ResponseFormat::Choice c;
  c.output.content = "Hi";
  c.output.tool_calls.push_back(ToolCall{"call_0", "f", "{}"});
  c.finish_reason = "tool_calls";
  const json::value r = json::parse(writer->full({c}, "", Usage{3, 4, 1}));
  EXPECT_EQ(r.at("object"), json::value("response"));
  EXPECT_EQ(r.at("status"), json::value("completed"));
  EXPECT_EQ(r.at("store"), json::value(false));
  EXPECT_EQ(r.at("metadata"), json::parse(R"({"k":"v"})"));
  EXPECT_EQ(r.at("output").at(0).at("content"),
            json::parse(R"([{"type":"output_text","text":"Hi","annotations":[],"logprobs":[]}])"));
  EXPECT_EQ(r.at("output").at(1).at("call_id"), json::value("call_0"));
  EXPECT_EQ(r.at("output").at(1).at("status"), json::value("completed"));
  EXPECT_EQ(r.at("usage"), json::parse(R"({"input_tokens":3,"input_tokens_details":{"cached_tokens":1},
      "output_tokens":4,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":7})"));
}

}  // namespace
}  // namespace tierlm::server
