// The Anthropic Messages decoder (body -> the normalized chat request the template sees) and writer (message body and
// the streaming event sequence), against the shapes Anthropic's API reference gives.
#include "server/anthropic_messages.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

namespace tierlm::server {
namespace {

namespace json = boost::json;

ApiError rejects(const std::string& body, const std::string& param) {
  try {
    parse_anthropic_messages(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_EQ(e.param(), param) << body << " -> " << e.what();
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

TEST(AnthropicMessages, ToolUseRoundTripBecomesTheOpenAIConversation) {
  const auto r = parse_anthropic_messages(R"({
    "model": "tierlm-tiny", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
    "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5, "metadata": {"user_id": "u1"},
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
               "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                         "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                    "content": [{"type": "text", "text": "18 C"}]},
                                   {"type": "text", "text": "And tomorrow?"}]}]})");
  const CompletionRequest& q = r.request;
  EXPECT_EQ(q.endpoint, Endpoint::chat);
  EXPECT_EQ(q.max_tokens, 64);
  EXPECT_EQ(q.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(q.sampling.temperature, 0.2f);
  EXPECT_EQ(q.sampling.top_k, 5);
  EXPECT_FALSE(q.parallel_tool_calls);
  EXPECT_EQ(q.tool_choice, ToolChoice::auto_);
  EXPECT_EQ(q.tools, json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])"));
  EXPECT_EQ(json::value(q.messages), json::parse(R"([
      {"role":"system","content":"Be brief."},
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":"Checking.","reasoning_content":"Use the tool.",
       "tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},
      {"role":"tool","tool_call_id":"toolu_1","content":"18 C","name":"get_weather"},
      {"role":"user","content":"And tomorrow?"}])"));
}

TEST(AnthropicMessages, RefusesWhatItDoesNotImplement) {
  const std::string m = R"("model":"x","messages":[{"role":"user","content":"hi"}])";
  rejects("{" + m + "}", "max_tokens");
  rejects(R"({"max_tokens":5,"messages":[{"role":"user","content":"hi"}]})", "model");
  rejects("{" + m + R"(,"max_tokens":5,"service_tier":"auto"})", "service_tier");
  rejects("{" + m + R"(,"max_tokens":5,"container":"c"})", "container");
  rejects("{" + m + R"(,"max_tokens":5,"metadata":{"tags":[]}})", "metadata.tags");
  rejects("{" + m + R"(,"max_tokens":5,"temperature":1.5})", "temperature");
  rejects("{" + m + R"(,"max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}]})", "tools[0].type");
  rejects("{" + m + R"(,"max_tokens":5,"tools":[{"name":"f","input_schema":{},"cache_control":{}}]})",
          "tools[0].cache_control");
  rejects("{" + m + R"(,"max_tokens":5,"tool_choice":{"type":"any"}})", "tool_choice");  // no tools
  rejects("{" + m + R"(,"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":2048}})", "thinking.budget_tokens");
  rejects(R"({"model":"x","max_tokens":5,"messages":[{"role":"system","content":"hi"}]})", "messages[0].role");
  rejects(R"({"model":"x","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})",
          "messages[0].content[0].type");
  rejects(R"({"model":"x","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a",
            "name":"f","input":{}}]}]})", "messages[0].content[0].type");
  auto count = parse_anthropic_count_tokens(R"({"model":"x","messages":[{"role":"user","content":"hi"}],
                                               "thinking":{"type":"disabled"}})");
  EXPECT_EQ(count.request.template_kwargs.at("enable_thinking"), json::value(false));
}

TEST(AnthropicMessages, ErrorShapeAndStopReasons) {
  const auto body = json::parse(anthropic_error_body(ApiError(404, "no such model", "invalid_request_error", "model")));
  EXPECT_EQ(body.at("type").as_string(), "error");
  EXPECT_EQ(body.at("error").at("type").as_string(), "not_found_error");
  EXPECT_EQ(json::parse(anthropic_error_body(ApiError(401, "k"))).at("error").at("type").as_string(),
            "authentication_error");
  EXPECT_EQ(json::parse(anthropic_error_body(ApiError(503, "busy"))).at("error").at("type").as_string(),
            "overloaded_error");
  EXPECT_EQ(anthropic_stop_reason("stop", ""), "end_turn");
  EXPECT_EQ(anthropic_stop_reason("stop", "END"), "stop_sequence");
  EXPECT_EQ(anthropic_stop_reason("length", ""), "max_tokens");
  EXPECT_EQ(anthropic_stop_reason("tool_calls", ""), "tool_use");
}

// Parses "event: X\ndata: {...}\n\n" records.
std::vector<std::pair<std::string, json::value>> events(const std::string& sse) {
  std::vector<std::pair<std::string, json::value>> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    const std::string rec = sse.substr(at, end - at);
    at = end + 2;
    const size_t nl = rec.find('\n');
    EXPECT_EQ(rec.substr(0, 7), "event: ");
    EXPECT_EQ(rec.substr(nl + 1, 6), "data: ");
    out.emplace_back(rec.substr(7, nl - 7), json::parse(rec.substr(nl + 7)));
    EXPECT_EQ(out.back().second.at("type").as_string(), out.back().first);  // the data names its event
  }
  return out;
}

TEST(AnthropicMessages, StreamingEventSequence) {
  auto w = make_anthropic_writer("tierlm-tiny", 12);
  std::string sse = w->stream_start(1);
  AssistantDelta thinking;
  thinking.reasoning = "hmm";
  sse += w->stream_delta(0, thinking, {}, 0);
  AssistantDelta text;
  text.content = "Hel";
  sse += w->stream_delta(0, text, {}, 0);
  text.content = "lo";
  sse += w->stream_delta(0, text, {}, 0);
  AssistantDelta call;
  call.tool_calls.push_back({"call_0", "get_weather", R"({"city":"Paris"})"});
  sse += w->stream_delta(0, call, {}, 0);
  Usage u;
  u.prompt_tokens = 12;
  u.completion_tokens = 9;
  sse += w->stream_choice_end(0, "tool_calls", "", u);
  sse += w->stream_end(u);
  const auto ev = events(sse);
  std::vector<std::string> names;
  for (const auto& e : ev) names.push_back(e.first);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "message_start", "content_block_start", "content_block_delta", "content_block_stop",
                       "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                       "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                       "message_stop"}));
  EXPECT_EQ(ev[0].second.at("message").at("usage").at("input_tokens").as_int64(), 12);
  EXPECT_EQ(ev[1].second.at("content_block").at("type").as_string(), "thinking");
  EXPECT_EQ(ev[2].second.at("delta").at("type").as_string(), "thinking_delta");
  EXPECT_EQ(ev[4].second.at("index").as_int64(), 1);
  EXPECT_EQ(ev[5].second.at("delta").at("text").as_string(), "Hel");
  EXPECT_EQ(ev[8].second.at("content_block").at("type").as_string(), "tool_use");
  EXPECT_EQ(ev[8].second.at("content_block").at("name").as_string(), "get_weather");
  EXPECT_EQ(ev[9].second.at("delta").at("type").as_string(), "input_json_delta");
  EXPECT_EQ(json::parse(ev[9].second.at("delta").at("partial_json").as_string()), json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(ev[10].second.at("index").as_int64(), 2);
  EXPECT_EQ(ev[11].second.at("delta").at("stop_reason").as_string(), "tool_use");
  EXPECT_EQ(ev[11].second.at("usage").at("output_tokens").as_int64(), 9);
}

TEST(AnthropicMessages, FullMessageBody) {
  auto w = make_anthropic_writer("tierlm-tiny", 3);
  ResponseFormat::Choice c;
  c.output.content = "Sure.";
  c.output.tool_calls.push_back({"call_0", "f", R"({"a":1})"});
  c.finish_reason = "tool_calls";
  Usage u;
  u.prompt_tokens = 3;
  u.completion_tokens = 4;
  const auto body = json::parse(w->full({c}, "", u));
  EXPECT_EQ(body.at("type").as_string(), "message");
  EXPECT_EQ(body.at("role").as_string(), "assistant");
  EXPECT_EQ(body.at("stop_reason").as_string(), "tool_use");
  EXPECT_EQ(body.at("content"), json::parse(R"([{"type":"text","text":"Sure."},
      {"type":"tool_use","id":"call_0","name":"f","input":{"a":1}}])"));
  EXPECT_EQ(body.at("usage"), json::parse(R"({"input_tokens":3,"output_tokens":4})"));
}

}  // namespace
}  // namespace tierlm::server
