#include "server/anthropic_messages.h"

#include <limits>
#include <map>
#include <random>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "server/json_fields.h"
#include "server/request_fields.h"

namespace tierlm::server {

namespace json = boost::json;
using namespace jsonf;

namespace {

// Text of a string or of an array of text blocks (system prompts, tool results).
std::string text_of(const json::value& v, const std::string& param) {
  if (v.is_string()) return std::string(v.get_string());
  if (!v.is_array()) wrong_type(param, "a string or an array of text blocks", v);
  std::string out;
  for (size_t i = 0; i < v.get_array().size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const auto& block = object_at(v.get_array()[i], p);
    const std::string type = required_string(block, "type", p + ".type");
    if (type != "text")
      invalid(p + ".type", fmt::format("Content block type '{}' is not supported here (text only).", type),
              "unsupported_value");
    out += required_string(block, "text", p + ".text");
  }
  return out;
}

// Anthropic's messages -> the OpenAI route's normalized messages: tool_use blocks become assistant tool_calls
// (arguments as objects, as templates expect), each tool_result block its own role "tool" message.
json::array convert_messages(const json::object& body) {
  json::array out;
  if (const json::value* system = field(body, "system")) {
    json::object m;
    m["role"] = "system";
    m["content"] = text_of(*system, "system");
    out.push_back(std::move(m));
  }
  const json::value* v = field(body, "messages");
  if (!v) missing("messages");
  if (!v->is_array()) wrong_type("messages", "an array", *v);
  if (v->get_array().empty()) invalid("messages", "'messages' must contain at least one message.");
  std::map<std::string, std::string> tool_names;  // tool_use id -> name, for the tool messages' "name"
  for (size_t i = 0; i < v->get_array().size(); ++i) {
    const std::string p = fmt::format("messages[{}]", i);
    const auto& m = object_at(v->get_array()[i], p);
    const std::string role = required_string(m, "role", p + ".role");
    if (role != "user" && role != "assistant")
      invalid(p + ".role", fmt::format("Invalid value: '{}'. Supported values are: 'user' and 'assistant'.", role));
    const json::value* content = m.if_contains("content");
    if (!content) missing(p + ".content");
    std::string text, reasoning;
    json::array calls;
    std::vector<json::object> results;
    if (content->is_string()) {
      text = std::string(content->get_string());
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->get_array().size(); ++j) {
        const std::string bp = fmt::format("{}.content[{}]", p, j);
        const auto& block = object_at(content->get_array()[j], bp);
        const std::string type = required_string(block, "type", bp + ".type");
        if (type == "text") {
          text += required_string(block, "text", bp + ".text");
        } else if (type == "thinking" && role == "assistant") {
          reasoning += required_string(block, "thinking", bp + ".thinking");
        } else if (type == "redacted_thinking" && role == "assistant") {
          // opaque to this server: nothing to show the template
        } else if (type == "tool_use" && role == "assistant") {
          const std::string id = required_string(block, "id", bp + ".id");
          const std::string name = required_string(block, "name", bp + ".name");
          const json::value* input = field(block, "input");
          if (!input) missing(bp + ".input");
          if (!input->is_object()) wrong_type(bp + ".input", "an object", *input);
          tool_names[id] = name;
          json::object fn;
          fn["name"] = name;
          fn["arguments"] = *input;
          json::object call;
          call["id"] = id;
          call["type"] = "function";
          call["function"] = std::move(fn);
          calls.push_back(std::move(call));
        } else if (type == "tool_result" && role == "user") {
          const std::string id = required_string(block, "tool_use_id", bp + ".tool_use_id");
          json::object r;
          r["role"] = "tool";
          r["tool_call_id"] = id;
          const json::value* c = field(block, "content");
          std::string result = c ? text_of(*c, bp + ".content") : std::string();
          if (auto is_error = boolean(block, "is_error"); is_error && *is_error) result = "Error: " + result;
          r["content"] = result;
          if (auto it = tool_names.find(id); it != tool_names.end()) r["name"] = it->second;
          results.push_back(std::move(r));
        } else {
          invalid(bp + ".type", fmt::format("Content block type '{}' is not supported in a {} message.", type, role),
                  "unsupported_value");
        }
      }
    } else {
      wrong_type(p + ".content", "a string or an array of content blocks", *content);
    }
    for (auto& r : results) out.push_back(std::move(r));
    if (role == "user" && !results.empty() && text.empty()) continue;
    json::object msg;
    msg["role"] = role;
    msg["content"] = text;
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
  }
  return out;
}

// tools [{name, description?, input_schema}] -> [{"type":"function","function":{name, description, parameters}}].
void convert_tools(const json::object& body, CompletionRequest& r) {
  if (const json::value* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    json::array out;
    for (size_t i = 0; i < tools->get_array().size(); ++i) {
      const std::string p = fmt::format("tools[{}]", i);
      const auto& t = object_at(tools->get_array()[i], p);
      if (auto type = string(t, "type", p + ".type"); type && *type != "custom")
        invalid(p + ".type", fmt::format("Tool type '{}' is not supported (server tools are not implemented; "
                                         "define custom tools with input_schema).", *type), "unsupported_value");
      for (const auto& kv : t) {
        const std::string_view key(kv.key().data(), kv.key().size());
        if (key != "type" && key != "name" && key != "description" && key != "input_schema")
          invalid(p + "." + std::string(key), fmt::format("Unrecognized tool field: {}.", key), "unknown_parameter");
      }
      json::object fn;
      fn["name"] = required_string(t, "name", p + ".name");
      if (auto d = string(t, "description", p + ".description")) fn["description"] = *d;
      const json::value* schema = field(t, "input_schema");
      if (!schema) missing(p + ".input_schema");
      fn["parameters"] = object_at(*schema, p + ".input_schema");
      json::object tool;
      tool["type"] = "function";
      tool["function"] = std::move(fn);
      out.push_back(std::move(tool));
    }
    if (!out.empty()) r.tools = std::move(out);
  }
  if (const json::value* choice = field(body, "tool_choice")) {
    const auto& c = object_at(*choice, "tool_choice");
    const std::string type = required_string(c, "type", "tool_choice.type");
    if (type == "auto") r.tool_choice = ToolChoice::auto_;
    else if (type == "none") r.tool_choice = ToolChoice::none;
    else if (type == "any") r.tool_choice = ToolChoice::required;
    else if (type == "tool") {
      r.tool_choice = ToolChoice::function;
      r.tool_choice_name = required_string(c, "name", "tool_choice.name");
    } else {
      invalid("tool_choice.type", fmt::format("Invalid value: '{}'. Supported values are: 'auto', 'any', 'tool' and "
                                              "'none'.", type));
    }
    if (auto d = boolean(c, "disable_parallel_tool_use")) r.parallel_tool_calls = !*d;
    if ((r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::function) && r.tools.is_null())
      invalid("tool_choice", "'tool_choice' requires 'tools' to be given.");
  }
}

// thinking: {"type":"enabled","budget_tokens":N} / {"type":"disabled"} -> the template's enable_thinking. The budget
// is checked as Anthropic does (>= 1024 and below max_tokens); the thinking itself is bounded by max_tokens.
void convert_thinking(const json::object& body, CompletionRequest& r) {
  const json::value* v = field(body, "thinking");
  if (!v) return;
  const auto& t = object_at(*v, "thinking");
  const std::string type = required_string(t, "type", "thinking.type");
  if (type == "disabled") {
    r.template_kwargs["enable_thinking"] = false;
  } else if (type == "enabled") {
    auto budget = integer(t, "budget_tokens", 1024, int64_t(1) << 30);
    if (!budget) missing("thinking.budget_tokens");
    if (r.max_tokens && *budget >= *r.max_tokens)
      invalid("thinking.budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'.");
    r.template_kwargs["enable_thinking"] = true;
  } else {
    invalid("thinking.type", fmt::format("Invalid value: '{}'. Supported values are: 'enabled' and 'disabled'.", type));
  }
}

CompletionRequest decode(const json::object& body, bool count_only) {
  CompletionRequest r;
  r.endpoint = Endpoint::chat;
  r.model = required_string(body, "model", "model");
  r.messages = convert_messages(body);
  convert_tools(body, r);
  if (count_only) {
    convert_thinking(body, r);
    return r;
  }
  auto max_tokens = integer(body, "max_tokens", 1, int64_t(1) << 30);
  if (!max_tokens) missing("max_tokens");
  r.max_tokens = *max_tokens;
  convert_thinking(body, r);
  if (const json::value* stops = field(body, "stop_sequences")) {
    if (!stops->is_array()) wrong_type("stop_sequences", "an array of strings", *stops);
    if (stops->get_array().size() > 16) invalid("stop_sequences", "At most 16 stop sequences are supported.");
    for (const auto& s : stops->get_array()) {
      if (!s.is_string()) wrong_type("stop_sequences", "an array of strings", s);
      if (s.get_string().empty()) invalid("stop_sequences", "Stop sequences must not be empty.");
      r.stop.emplace_back(s.get_string());
    }
  }
  r.stream = boolean(body, "stream").value_or(false);
  r.include_usage = true;
  auto& s = r.sampling;
  s.temperature = float(number(body, "temperature", 0, 1).value_or(1.0));
  s.top_p = float(number(body, "top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0.0f) invalid("top_p", "'top_p' must be greater than 0.");
  if (auto k = integer(body, "top_k", 0, std::numeric_limits<int32_t>::max())) s.top_k = int(*k);
  if (const json::value* metadata = field(body, "metadata")) {
    // Only user_id, an opaque label for the client's own bookkeeping.
    static constexpr std::string_view kMetadata[] = {"user_id"};
    reject_unknown_fields(object_at(*metadata, "metadata"), kMetadata, "metadata");
  }
  return r;
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

std::string event(std::string_view name, const json::object& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, json::serialize(data));
}

json::value input_object(const std::string& arguments) {
  boost::system::error_code ec;
  json::value v = json::parse(arguments, ec);
  return !ec && v.is_object() ? v : json::value(json::object());
}

json::object usage(int64_t input, int64_t output) {
  json::object u;
  u["input_tokens"] = input;
  u["output_tokens"] = output;
  return u;
}

class AnthropicWriter final : public CompletionWriter {
 public:
  AnthropicWriter(std::string model, int64_t prompt_tokens)
      : model_(std::move(model)), id_(random_id("msg_")), prompt_tokens_(prompt_tokens) {}

  std::string stream_start(int) override {
    json::object message = message_head();
    message["content"] = json::array();
    message["stop_reason"] = nullptr;
    message["stop_sequence"] = nullptr;
    message["usage"] = usage(prompt_tokens_, 0);
    json::object data;
    data["type"] = "message_start";
    data["message"] = std::move(message);
    return event("message_start", data);
  }

  std::string stream_delta(int, const AssistantDelta& d, const std::vector<LogprobEntry>&, int) override {
    std::string out;
    if (!d.reasoning.empty()) out += block_text("thinking", "thinking_delta", "thinking", d.reasoning);
    if (!d.content.empty()) out += block_text("text", "text_delta", "text", d.content);
    for (const auto& call : d.tool_calls) {
      out += close_block();
      json::object block;
      block["type"] = "tool_use";
      block["id"] = call.id;
      block["name"] = call.name;
      block["input"] = json::object();
      out += open_block("tool_use", std::move(block));
      for (const std::string& piece : argument_pieces(call.arguments)) {
        json::object delta;
        delta["type"] = "input_json_delta";
        delta["partial_json"] = piece;
        out += block_delta(std::move(delta));
      }
      out += close_block();
    }
    return out;
  }

  std::string stream_choice_end(int, const std::string& finish_reason, const std::string& stop_sequence,
                                const Usage& u) override {
    std::string out = close_block();
    json::object delta;
    delta["stop_reason"] = anthropic_stop_reason(finish_reason, stop_sequence);
    delta["stop_sequence"] = stop_sequence.empty() ? json::value(nullptr) : json::value(stop_sequence);
    json::object data;
    data["type"] = "message_delta";
    data["delta"] = std::move(delta);
    data["usage"] = usage(u.prompt_tokens, u.completion_tokens);
    return out + event("message_delta", data);
  }

  std::string stream_end(const Usage&) override {
    json::object data;
    data["type"] = "message_stop";
    return event("message_stop", data);
  }

  std::string stream_error(const ApiError& error) override {
    return fmt::format("event: error\ndata: {}\n\n", anthropic_error_body(error));
  }

  std::string full(const std::vector<ResponseFormat::Choice>& choices, const std::string& stop_sequence,
                   const Usage& total) override {
    const auto& c = choices.at(0);
    json::array content;
    if (!c.output.reasoning.empty()) {
      json::object b;
      b["type"] = "thinking";
      b["thinking"] = c.output.reasoning;
      b["signature"] = "";
      content.push_back(std::move(b));
    }
    if (!c.output.content.empty() || (c.output.tool_calls.empty() && c.output.reasoning.empty())) {
      json::object b;
      b["type"] = "text";
      b["text"] = c.output.content;
      content.push_back(std::move(b));
    }
    for (const auto& call : c.output.tool_calls) {
      json::object b;
      b["type"] = "tool_use";
      b["id"] = call.id;
      b["name"] = call.name;
      b["input"] = input_object(call.arguments);
      content.push_back(std::move(b));
    }
    json::object body = message_head();
    body["content"] = std::move(content);
    body["stop_reason"] = anthropic_stop_reason(c.finish_reason, stop_sequence);
    body["stop_sequence"] = stop_sequence.empty() ? json::value(nullptr) : json::value(stop_sequence);
    body["usage"] = usage(total.prompt_tokens, total.completion_tokens);
    return json::serialize(body);
  }

 private:
  json::object message_head() const {
    json::object m;
    m["id"] = id_;
    m["type"] = "message";
    m["role"] = "assistant";
    m["model"] = model_;
    return m;
  }

  std::string open_block(const std::string& type, json::object block) {
    open_type_ = type;
    json::object data;
    data["type"] = "content_block_start";
    data["index"] = index_;
    data["content_block"] = std::move(block);
    return event("content_block_start", data);
  }

  std::string block_delta(json::object delta) {
    json::object data;
    data["type"] = "content_block_delta";
    data["index"] = index_;
    data["delta"] = std::move(delta);
    return event("content_block_delta", data);
  }

  std::string close_block() {
    if (open_type_.empty()) return {};
    json::object data;
    data["type"] = "content_block_stop";
    data["index"] = index_++;
    open_type_.clear();
    return event("content_block_stop", data);
  }

  // Text continues the open block of its type, or closes the open one and starts its own.
  std::string block_text(const std::string& type, const char* delta_type, const char* key, const std::string& text) {
    std::string out;
    if (open_type_ != type) {
      out += close_block();
      json::object block;
      block["type"] = type;
      block[key] = "";
      if (type == "thinking") block["signature"] = "";
      out += open_block(type, std::move(block));
    }
    json::object delta;
    delta["type"] = delta_type;
    delta[key] = text;
    return out + block_delta(std::move(delta));
  }

  std::string model_, id_;
  int64_t prompt_tokens_;
  int64_t index_ = 0;
  std::string open_type_;  // the block being streamed ("" when none)
};

}  // namespace

AnthropicRequest parse_anthropic_messages(std::string_view text) {
  const json::object body = parse_object_body(text);
  reject_unknown_fields(body, BodyKind::anthropic_messages);
  return AnthropicRequest{decode(body, false)};
}

AnthropicRequest parse_anthropic_count_tokens(std::string_view text) {
  const json::object body = parse_object_body(text);
  reject_unknown_fields(body, BodyKind::anthropic_count_tokens);
  return AnthropicRequest{decode(body, true)};
}

std::string anthropic_stop_reason(const std::string& finish_reason, const std::string& stop_sequence) {
  if (finish_reason == "tool_calls") return "tool_use";
  if (finish_reason == "length") return "max_tokens";
  if (!stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

std::string anthropic_error_body(const ApiError& e) {
  const char* type = "invalid_request_error";
  switch (e.status()) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default:
      if (e.status() >= 500) type = "api_error";
  }
  json::object error;
  error["type"] = type;
  error["message"] = e.param().empty() ? std::string(e.what()) : fmt::format("{}: {}", e.param(), e.what());
  json::object body;
  body["type"] = "error";
  body["error"] = std::move(error);
  return json::serialize(body);
}

std::string anthropic_count_tokens_body(int64_t input_tokens) {
  json::object body;
  body["input_tokens"] = input_tokens;
  return json::serialize(body);
}

std::unique_ptr<CompletionWriter> make_anthropic_writer(std::string model, int64_t prompt_tokens) {
  return std::make_unique<AnthropicWriter>(std::move(model), prompt_tokens);
}

}  // namespace tierlm::server
