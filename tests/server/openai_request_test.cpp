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

TEST(OpenAIRequest, ChoicesUpToSixteen) {
  EXPECT_EQ(parse_completion_request(std::string("{") + kMsgs + R"(,"n":3})", Endpoint::chat).n, 3);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"a","n":2})", Endpoint::completion).n, 2);
  rejects(std::string("{") + kMsgs + R"(,"n":17})", "n");
  rejects(std::string("{") + kMsgs + R"(,"n":0})", "n");
}

// Every field a route does not implement is refused by name, including ones OpenAI defines.
TEST(OpenAIRequest, UnimplementedFieldsAreRefusedByName) {
  auto e = rejects(std::string("{") + kMsgs + R"(,"store":true})", "store");
  EXPECT_EQ(e.code(), "unknown_parameter");
  rejects(std::string("{") + kMsgs + R"(,"modalities":["text","audio"]})", "modalities");
  rejects(std::string("{") + kMsgs + R"(,"prediction":{}})", "prediction");
  rejects(std::string("{") + kMsgs + R"(,"functions":[]})", "functions");
  rejects(std::string("{") + kMsgs + R"(,"web_search_options":{}})", "web_search_options");
  rejects(R"({"prompt":"a","tools":[]})", "tools", Endpoint::completion);  // a chat-only field on completions
  rejects(std::string("{") + kMsgs + R"(,"stream":true,"stream_options":{"include_obfuscation":true}})",
          "stream_options.include_obfuscation");
  rejects(std::string("{") + kMsgs + R"(,"stream_options":{"include_usage":true}})", "stream_options");
  // response_format is implemented (json_object / json_schema through the grammar engine); a kind it does not know
  // is refused by name.
  rejects(std::string("{") + kMsgs + R"(,"response_format":{"type":"xml"}})", "response_format.type");
  parse_completion_request(std::string("{") + kMsgs + R"(,"response_format":{"type":"text"},"user":"u"})",
                           Endpoint::chat);
}

TEST(OpenAIRequest, ToolsAndToolChoice) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}},
                                        {"type":"function","function":{"name":"g"}}])";
  auto a = parse_completion_request(std::string("{") + kMsgs + "," + tools + "}", Endpoint::chat);
  EXPECT_EQ(a.tool_choice, ToolChoice::auto_);
  EXPECT_TRUE(a.parallel_tool_calls);
  EXPECT_EQ(a.tools.as_array().size(), 2u);
  auto b = parse_completion_request(
      std::string("{") + kMsgs + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}},
      "parallel_tool_calls":false})", Endpoint::chat);
  EXPECT_EQ(b.tool_choice, ToolChoice::function);
  EXPECT_EQ(b.tool_choice_name, "g");
  EXPECT_FALSE(b.parallel_tool_calls);
  EXPECT_EQ(parse_completion_request(std::string("{") + kMsgs + "," + tools + R"(,"tool_choice":"none"})",
                                     Endpoint::chat).tool_choice, ToolChoice::none);
  EXPECT_EQ(parse_completion_request(std::string("{") + kMsgs + "," + tools + R"(,"tool_choice":"required"})",
                                     Endpoint::chat).tool_choice, ToolChoice::required);
  rejects(std::string("{") + kMsgs + "," + tools + R"(,"tool_choice":"always"})", "tool_choice");
  rejects(std::string("{") + kMsgs + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"h"}}})",
          "tool_choice");
  rejects(std::string("{") + kMsgs + R"(,"tool_choice":"required"})", "tool_choice");  // no tools
  rejects(std::string("{") + kMsgs + R"(,"tools":[{"type":"retrieval"}]})", "tools[0].type");
  rejects(std::string("{") + kMsgs + R"(,"tools":[{"type":"function","function":{}}]})", "tools[0].function.name");
  rejects(std::string("{") + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f"}},
                                                  {"type":"function","function":{"name":"f"}}]})",
          "tools[1].function.name");
  rejects(std::string("{") + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":3}}]})",
          "tools[0].function.parameters");
}

TEST(OpenAIRequest, TemplateKwargsAndReasoningEffort) {
  auto r = parse_completion_request(
      std::string("{") + kMsgs + R"(,"chat_template_kwargs":{"enable_thinking":false,"x":[1]},"reasoning_effort":"low"})",
      Endpoint::chat);
  EXPECT_EQ(r.template_kwargs.at("enable_thinking"), boost::json::value(false));
  EXPECT_EQ(r.template_kwargs.at("x"), boost::json::parse("[1]"));
  EXPECT_EQ(r.template_kwargs.at("reasoning_effort").as_string(), "low");
  rejects(std::string("{") + kMsgs + R"(,"chat_template_kwargs":{"messages":[]}})", "chat_template_kwargs.messages");
  rejects(std::string("{") + kMsgs + R"(,"chat_template_kwargs":[1]})", "chat_template_kwargs");
  rejects(std::string("{") + kMsgs + R"(,"reasoning_effort":"extreme"})", "reasoning_effort");
}

TEST(OpenAIRequest, LogitBias) {
  auto r = parse_completion_request(std::string("{") + kMsgs + R"(,"logit_bias":{"5":-100,"17":2.5}})", Endpoint::chat);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  EXPECT_EQ(r.sampling.logit_bias[1], (std::pair<int32_t, float>{17, 2.5f}));
  rejects(std::string("{") + kMsgs + R"(,"logit_bias":{"x":1}})", "logit_bias");
  rejects(std::string("{") + kMsgs + R"(,"logit_bias":{"-1":1}})", "logit_bias");
  rejects(std::string("{") + kMsgs + R"(,"logit_bias":{"1":101}})", "logit_bias");
  rejects(std::string("{") + kMsgs + R"(,"logit_bias":{"1":"a"}})", "logit_bias");
  rejects(std::string("{") + kMsgs + R"(,"logit_bias":[1]})", "logit_bias");
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
  auto e = rejects(std::string("{") + kMsgs + R"(,"n":30})", "n");
  auto body = boost::json::parse(e.body()).as_object();
  auto& err = body.at("error").as_object();
  EXPECT_TRUE(err.at("message").is_string());
  EXPECT_EQ(err.at("type").as_string(), "invalid_request_error");
  EXPECT_EQ(err.at("param").as_string(), "n");
  EXPECT_EQ(err.at("code").as_string(), "invalid_value");
  auto plain = boost::json::parse(ApiError(404, "x").body()).as_object();
  EXPECT_TRUE(plain.at("error").at("param").is_null());
  EXPECT_TRUE(plain.at("error").at("code").is_null());
}

}  // namespace
}  // namespace tierlm::server
