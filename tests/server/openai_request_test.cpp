#include "server/openai_request.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include "server/api_error.h"

namespace tierlm::server {
namespace {

// Expects a 400 naming `param`; returns the error for further checks.
ApiError rejects(const std::string& body, const std::string& param, Endpoint e = Endpoint::chat) {
  try {
    parse_completion_request(body, e);
  } catch (const ApiError& err) {
    EXPECT_EQ(err.status(), 400) << body;
    EXPECT_EQ(err.param(), param) << body << " -> " << err.what();
    return err;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

TEST(OpenAIRequest, ChatDefaultsAndFields) {
  auto r = parse_completion_request(
      std::string("{") + kMsgs +
          R"(,"model":"m","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":-3,
              "stop":["a","b"],"presence_penalty":0.5,"frequency_penalty":-0.5,"n":1,"stream":true,
              "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,"user":"x"})",
      Endpoint::chat);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_TRUE(r.sampling.has_seed);
  EXPECT_EQ(r.sampling.seed, uint64_t(int64_t(-3)));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.top_logprobs, 3);
  ASSERT_EQ(r.messages.size(), 1u);

  auto d = parse_completion_request(std::string("{") + kMsgs + "}", Endpoint::chat);
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(d.top_logprobs, -1);
  EXPECT_FALSE(d.stream);
}

TEST(OpenAIRequest, MaxCompletionTokensWins) {
  auto r = parse_completion_request(std::string("{") + kMsgs + R"(,"max_tokens":5,"max_completion_tokens":9})",
                                    Endpoint::chat);
  EXPECT_EQ(r.max_tokens, 9);
}

TEST(OpenAIRequest, MessagesOfEveryRole) {
  auto r = parse_completion_request(R"({"messages":[
      {"role":"system","content":"s"},
      {"role":"developer","content":"d"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
          "function":{"name":"f","arguments":"{\"x\":1}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"}],
      "tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})",
                                    Endpoint::chat);
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[1].at("role").as_string(), "system");
  EXPECT_EQ(r.messages[2].at("content").as_string(), "ab");
  EXPECT_EQ(r.messages[3].at("content").as_string(), "");
  // Arguments given as a JSON string are parsed into an object for the template.
  EXPECT_EQ(r.messages[3].at("tool_calls").at(0).at("function").at("arguments").at("x").as_int64(), 1);
  EXPECT_EQ(r.messages[4].at("tool_call_id").as_string(), "c1");
  EXPECT_TRUE(r.tools.is_array());
}

TEST(OpenAIRequest, MalformedJsonAndWrongTopLevel) {
  auto e = rejects("{\"messages\": [", "");
  EXPECT_EQ(e.code(), "invalid_json");
  rejects("[1,2]", "");
  rejects("", "");
}

TEST(OpenAIRequest, WrongTypesNameTheParameter) {
  rejects(R"({"messages":"hi"})", "messages");
  rejects(R"({"messages":[]})", "messages");
  rejects(R"({"messages":[{"content":"x"}]})", "messages[0].role");
  rejects(R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role");
  rejects(R"({"messages":[{"role":"user"}]})", "messages[0].content");
  rejects(R"({"messages":[{"role":"user","content":5}]})", "messages[0].content");
  rejects(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
          "messages[0].content[0].type");
  rejects(R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id");
  rejects(std::string("{") + kMsgs + R"(,"max_tokens":"5"})", "max_tokens");
  rejects(std::string("{") + kMsgs + R"(,"max_tokens":0})", "max_tokens");
  rejects(std::string("{") + kMsgs + R"(,"max_tokens":2.5})", "max_tokens");
  rejects(std::string("{") + kMsgs + R"(,"temperature":"hot"})", "temperature");
  rejects(std::string("{") + kMsgs + R"(,"temperature":3})", "temperature");
  rejects(std::string("{") + kMsgs + R"(,"top_p":0})", "top_p");
  rejects(std::string("{") + kMsgs + R"(,"presence_penalty":2.5})", "presence_penalty");
  rejects(std::string("{") + kMsgs + R"(,"stop":5})", "stop");
  rejects(std::string("{") + kMsgs + R"(,"stop":["a",1]})", "stop");
  rejects(std::string("{") + kMsgs + R"(,"stop":[""]})", "stop");
  rejects(std::string("{") + kMsgs + R"(,"stream":"yes"})", "stream");
  rejects(std::string("{") + kMsgs + R"(,"model":7})", "model");
  rejects(std::string("{") + kMsgs + R"(,"seed":"1"})", "seed");
  rejects(std::string("{") + kMsgs + R"(,"top_logprobs":2})", "top_logprobs");  // needs logprobs: true
  rejects(std::string("{") + kMsgs + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs");
}

TEST(OpenAIRequest, OnlyOneChoice) {
  auto e = rejects(std::string("{") + kMsgs + R"(,"n":2})", "n");
  EXPECT_EQ(e.code(), "unsupported_value");
  parse_completion_request(std::string("{") + kMsgs + R"(,"n":1})", Endpoint::chat);
}

TEST(OpenAIRequest, CompletionPrompts) {
  auto a = parse_completion_request(R"({"prompt":"abc","logprobs":2,"stop":"x"})", Endpoint::completion);
  EXPECT_EQ(a.prompt_text, "abc");
  EXPECT_EQ(a.top_logprobs, 2);
  EXPECT_EQ(a.stop, std::vector<std::string>{"x"});
  auto b = parse_completion_request(R"({"prompt":["abc"]})", Endpoint::completion);
  EXPECT_EQ(b.prompt_text, "abc");
  auto c = parse_completion_request(R"({"prompt":[1,2,3]})", Endpoint::completion);
  EXPECT_TRUE(c.prompt_is_tokens);
  EXPECT_EQ(c.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  auto d = parse_completion_request(R"({"prompt":[[4,5]]})", Endpoint::completion);
  EXPECT_EQ(d.prompt_tokens, (std::vector<int32_t>{4, 5}));
  rejects(R"({})", "prompt", Endpoint::completion);
  rejects(R"({"prompt":["a","b"]})", "prompt", Endpoint::completion);
  rejects(R"({"prompt":[1,-2]})", "prompt", Endpoint::completion);
  rejects(R"({"prompt":{"a":1}})", "prompt", Endpoint::completion);
  rejects(R"({"prompt":"a","echo":true})", "echo", Endpoint::completion);
  rejects(R"({"prompt":"a","logprobs":6})", "logprobs", Endpoint::completion);
}

TEST(OpenAIRequest, ErrorBodyShape) {
  auto e = rejects(std::string("{") + kMsgs + R"(,"n":3})", "n");
  auto body = boost::json::parse(e.body()).as_object();
  auto& err = body.at("error").as_object();
  EXPECT_TRUE(err.at("message").is_string());
  EXPECT_EQ(err.at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(err.at("param").as_string(), "n");
  EXPECT_EQ(err.at("code").as_string(), "unsupported_value");
  auto plain = boost::json::parse(ApiError(404, "x").body()).as_object();
  EXPECT_TRUE(plain.at("error").at("param").is_null());
  EXPECT_TRUE(plain.at("error").at("code").is_null());
}

}  // namespace
}  // namespace tierlm::server
