#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/request_fields.h"

namespace tierlm::server {

namespace json = boost::json;
using namespace jsonf;  // invalid, wrong_type, field, number, integer, boolean, string, kind_of

namespace {

// content: a string, or an array of {"type":"text","text":...} parts (concatenated), or null.
std::string message_content(const json::value* v, const std::string& param) {
  if (!v || v->is_null()) return {};
  if (v->is_string()) return std::string(v->get_string());
  if (!v->is_array()) wrong_type(param, "a string or an array of content parts", *v);
  std::string text;
  size_t i = 0;
  for (const auto& part : v->get_array()) {
    const std::string p = fmt::format("{}[{}]", param, i++);
    if (!part.is_object()) wrong_type(p, "an object", part);
    const auto& po = part.get_object();
    auto type = string(po, "type", p + ".type");
    if (!type) invalid(p + ".type", fmt::format("Missing required parameter: '{}.type'.", p), "missing_required_parameter");
    if (*type != "text")
      invalid(p + ".type", fmt::format("Content part type '{}' is not supported by this model (text only).", *type));
    auto t = string(po, "text", p + ".text");
    if (!t) invalid(p + ".text", fmt::format("Missing required parameter: '{}.text'.", p), "missing_required_parameter");
    text += *t;
  }
  return text;
}

json::array parse_messages(const json::object& body) {
  const json::value* v = field(body, "messages");
  if (!v) invalid("messages", "Missing required parameter: 'messages'.", "missing_required_parameter");
  if (!v->is_array()) wrong_type("messages", "an array", *v);
  const auto& in = v->get_array();
  if (in.empty()) invalid("messages", "'messages' must contain at least one message.");
  json::array out;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string p = fmt::format("messages[{}]", i);
    if (!in[i].is_object()) wrong_type(p, "an object", in[i]);
    const auto& m = in[i].get_object();
    auto role = string(m, "role", p + ".role");
    if (!role) invalid(p + ".role", fmt::format("Missing required parameter: '{}.role'.", p), "missing_required_parameter");
    if (*role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool")
      invalid(p + ".role", fmt::format("Invalid value: '{}'. Supported values are: 'system', 'developer', 'user', "
                                       "'assistant', and 'tool'.", *role));
    json::object msg;
    msg["role"] = *role;
    const json::value* content = m.if_contains("content");
    if ((!content || content->is_null()) && *role != "assistant")
      invalid(p + ".content", fmt::format("Missing required parameter: '{}.content'.", p), "missing_required_parameter");
    msg["content"] = message_content(content, p + ".content");
    if (auto name = string(m, "name", p + ".name")) msg["name"] = *name;
    if (*role == "tool") {
      auto id = string(m, "tool_call_id", p + ".tool_call_id");
      if (!id) invalid(p + ".tool_call_id", fmt::format("Missing required parameter: '{}.tool_call_id'.", p),
                       "missing_required_parameter");
      msg["tool_call_id"] = *id;
    }
    if (const json::value* calls = field(m, "tool_calls")) {
      if (*role != "assistant") invalid(p + ".tool_calls", "'tool_calls' is only allowed on assistant messages.");
      if (!calls->is_array()) wrong_type(p + ".tool_calls", "an array", *calls);
      json::array normalized;
      for (size_t j = 0; j < calls->get_array().size(); ++j) {
        const auto& call = calls->get_array()[j];
        const std::string cp = fmt::format("{}.tool_calls[{}]", p, j);
        if (!call.is_object()) wrong_type(cp, "an object", call);
        json::object c = call.get_object();
        // Templates expect arguments as a mapping (they apply tojson); OpenAI sends a JSON string.
        if (auto* fn = c.if_contains("function"); fn && fn->is_object()) {
          auto& f = fn->get_object();
          if (auto* args = f.if_contains("arguments"); args && args->is_string()) {
            boost::system::error_code ec;
            json::value parsed = json::parse(args->get_string(), ec);
            if (!ec) f["arguments"] = std::move(parsed);
          }
        } else {
          invalid(cp + ".function", fmt::format("Missing required parameter: '{}.function'.", cp),
                  "missing_required_parameter");
        }
        normalized.push_back(std::move(c));
      }
      msg["tool_calls"] = std::move(normalized);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// tools: [{"type":"function","function":{"name", "description"?, "parameters"?, "strict"?}}], names unique.
void parse_tools(const json::object& body, CompletionRequest& r) {
  if (const json::value* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    std::vector<std::string> names;
    for (size_t i = 0; i < tools->get_array().size(); ++i) {
      const auto& t = tools->get_array()[i];
      const std::string p = fmt::format("tools[{}]", i);
      if (!t.is_object()) wrong_type(p, "an object", t);
      auto type = string(t.get_object(), "type", p + ".type");
      if (type.value_or("function") != "function")
        invalid(p + ".type", fmt::format("Tool type '{}' is not supported (only 'function').", *type), "unsupported_value");
      const json::value* fn = field(t.get_object(), "function");
      if (!fn) invalid(p + ".function", fmt::format("Missing required parameter: '{}.function'.", p),
                       "missing_required_parameter");
      if (!fn->is_object()) wrong_type(p + ".function", "an object", *fn);
      auto name = string(fn->get_object(), "name", p + ".function.name");
      if (!name || name->empty())
        invalid(p + ".function.name", fmt::format("Missing required parameter: '{}.function.name'.", p),
                "missing_required_parameter");
      if (std::find(names.begin(), names.end(), *name) != names.end())
        invalid(p + ".function.name", fmt::format("Duplicate function name '{}'.", *name));
      names.push_back(*name);
      if (const json::value* params = field(fn->get_object(), "parameters"); params && !params->is_object())
        wrong_type(p + ".function.parameters", "an object", *params);
    }
    if (!tools->get_array().empty()) r.tools = *tools;
  }
  if (const json::value* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      if (!tool_choice_keyword(choice->get_string(), r.tool_choice))
        invalid("tool_choice", fmt::format("Invalid value: '{}'. Supported values are: 'none', 'auto' and "
                                           "'required', or an object naming a function.",
                                           std::string_view(choice->get_string())));
    } else if (choice->is_object()) {
      const json::value* fn = field(choice->get_object(), "function");
      auto type = string(choice->get_object(), "type", "tool_choice.type");
      if (type.value_or("function") != "function" || !fn || !fn->is_object())
        invalid("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}.");
      auto name = string(fn->get_object(), "name", "tool_choice.function.name");
      if (!name) invalid("tool_choice.function.name", "Missing required parameter: 'tool_choice.function.name'.",
                         "missing_required_parameter");
      r.tool_choice = ToolChoice::function;
      r.tool_choice_name = *name;
    } else {
      wrong_type("tool_choice", "a string or an object", *choice);
    }
    check_tool_choice(r);
  }
  r.parallel_tool_calls = boolean(body, "parallel_tool_calls").value_or(true);
}

// chat_template_kwargs (an object of extra template variables) and reasoning_effort (low | medium | high).
void parse_template_kwargs(const json::object& body, CompletionRequest& r) {
  if (const json::value* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    for (const auto& item : kw->get_object()) {
      const std::string_view key(item.key().data(), item.key().size());
      // These are the conversation itself; letting a kwarg replace them would bypass validation.
      for (std::string_view reserved : {"messages", "tools", "add_generation_prompt", "documents"})
        if (key == reserved)
          invalid("chat_template_kwargs." + std::string(key),
                  fmt::format("'{}' cannot be set through chat_template_kwargs.", key));
      r.template_kwargs[key] = item.value();
    }
  }
  if (auto effort = string(body, "reasoning_effort", "reasoning_effort")) {
    if (*effort != "low" && *effort != "medium" && *effort != "high" && *effort != "minimal")
      invalid("reasoning_effort", fmt::format("Invalid value: '{}'. Supported values are: 'minimal', 'low', "
                                              "'medium' and 'high'.", *effort));
    r.template_kwargs["reasoning_effort"] = *effort;
  }
}

// logit_bias: {"token id": bias in [-100, 100]}; ids are checked against the vocabulary by the service.
void parse_logit_bias(const json::object& body, CompletionRequest& r) {
  const json::value* v = field(body, "logit_bias");
  if (!v) return;
  if (!v->is_object()) wrong_type("logit_bias", "an object mapping token ids to numbers", *v);
  if (v->get_object().size() > 1024) invalid("logit_bias", "At most 1024 tokens may be biased.");
  for (const auto& item : v->get_object()) {
    const std::string key(item.key());
    int64_t id = -1;
    try {
      size_t used = 0;
      id = std::stoll(key, &used);
      if (used != key.size()) id = -1;
    } catch (...) {
      id = -1;
    }
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      invalid("logit_bias", fmt::format("Invalid key '{}' in 'logit_bias': keys must be token ids.", key));
    const json::value& b = item.value();
    if (!b.is_number()) wrong_type("logit_bias", "an object mapping token ids to numbers", b);
    const double bias = b.to_number<double>();
    if (!(bias >= -100 && bias <= 100))
      invalid("logit_bias", fmt::format("Bias for token {} must be between -100 and 100, got {}.", id, bias));
    r.sampling.logit_bias.emplace_back(int32_t(id), float(bias));
  }
}

void parse_prompt(const json::object& body, CompletionRequest& r) {
  const json::value* v = field(body, "prompt");
  if (!v) invalid("prompt", "Missing required parameter: 'prompt'.", "missing_required_parameter");
  auto token_list = [&](const json::array& a, const std::string& param) {
    for (const auto& t : a) {
      if (!t.is_int64() && !t.is_uint64()) wrong_type(param, "an array of token ids", t);
      if (t.is_uint64() || t.get_int64() < 0 || t.get_int64() > std::numeric_limits<int32_t>::max())
        invalid(param, "Token ids must be non-negative 32-bit integers.");
      r.prompt_tokens.push_back(int32_t(t.get_int64()));
    }
    r.prompt_is_tokens = true;
  };
  if (v->is_string()) {
    r.prompt_text = std::string(v->get_string());
    return;
  }
  if (!v->is_array()) wrong_type("prompt", "a string, an array of strings or an array of token ids", *v);
  const auto& a = v->get_array();
  if (a.empty()) invalid("prompt", "'prompt' must not be empty.");
  if (a[0].is_string() || a[0].is_array()) {
    // A batch of prompts would need n choices; one prompt per request is supported.
    if (a.size() != 1) invalid("prompt", "Only one prompt per request is supported (got a batch of " +
                                             std::to_string(a.size()) + ").", "unsupported_value");
    if (a[0].is_string()) r.prompt_text = std::string(a[0].get_string());
    else token_list(a[0].get_array(), "prompt[0]");
    return;
  }
  token_list(a, "prompt");
}

// response_format: {type: text | json_object | json_schema, json_schema: {name, schema, strict, description}}.
// The schema itself is checked when it is compiled (the service answers 400 naming an unsupported keyword).
StructuredOutput parse_response_format(const json::object& body) {
  StructuredOutput out;
  const json::value* format = field(body, "response_format");
  if (!format) return out;
  if (!format->is_object()) wrong_type("response_format", "an object", *format);
  const json::object& f = format->get_object();
  const json::value* type = field(f, "type");
  if (!type) invalid("response_format.type", "'response_format' needs a 'type' (text, json_object or json_schema).");
  if (!type->is_string()) wrong_type("response_format.type", "a string", *type);
  const std::string_view kind = type->get_string();
  if (kind == "text") return out;
  if (kind == "json_object") {
    out.kind = StructuredOutput::Kind::json_object;
    return out;
  }
  if (kind != "json_schema")
    invalid("response_format.type",
            fmt::format("Invalid 'response_format.type': '{}' (expected text, json_object or json_schema).", kind));
  out.kind = StructuredOutput::Kind::json_schema;
  const json::value* spec = field(f, "json_schema");
  if (!spec) invalid("response_format.json_schema", "'response_format' of type json_schema needs 'json_schema'.");
  if (!spec->is_object()) wrong_type("response_format.json_schema", "an object", *spec);
  const json::object& js = spec->get_object();
  const json::value* name = field(js, "name");
  if (!name) invalid("response_format.json_schema.name", "'response_format.json_schema' needs a 'name'.");
  if (!name->is_string()) wrong_type("response_format.json_schema.name", "a string", *name);
  out.name = std::string(name->get_string());
  if (const json::value* schema = field(js, "schema")) {
    if (!schema->is_object() && !schema->is_bool())
      wrong_type("response_format.json_schema.schema", "an object", *schema);
    out.schema = *schema;
  }
  if (const json::value* strict = field(js, "strict")) {
    if (!strict->is_bool()) wrong_type("response_format.json_schema.strict", "a boolean", *strict);
    out.strict = strict->get_bool();
  }
  return out;
}

}  // namespace

bool tool_choice_keyword(std::string_view value, ToolChoice& out) {
  if (value == "auto") out = ToolChoice::auto_;
  else if (value == "none") out = ToolChoice::none;
  else if (value == "required") out = ToolChoice::required;
  else return false;
  return true;
}

void check_tool_choice(const CompletionRequest& r) {
  if ((r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::function) && r.tools.is_null())
    invalid("tool_choice", "'tool_choice' requires 'tools' to be given.");
  if (r.tool_choice != ToolChoice::function) return;
  for (const auto& t : r.tools.get_array())
    if (t.at("function").at("name").as_string() == r.tool_choice_name) return;
  invalid("tool_choice", fmt::format("Function '{}' named by 'tool_choice' is not among 'tools'.", r.tool_choice_name));
}

CompletionRequest parse_completion_request(std::string_view text, Endpoint endpoint) {
  const json::object body = parse_object_body(text);
  reject_unknown_fields(body, endpoint == Endpoint::chat ? BodyKind::chat_completions : BodyKind::completions);
  CompletionRequest r;
  r.endpoint = endpoint;
  if (auto model = string(body, "model", "model")) r.model = *model;

  if (endpoint == Endpoint::chat) {
    r.messages = parse_messages(body);
    parse_tools(body, r);
    parse_template_kwargs(body, r);
  } else {
    parse_prompt(body, r);
    if (auto echo = boolean(body, "echo"); echo && *echo)
      invalid("echo", "'echo' is not supported.", "unsupported_value");
    if (auto suffix = string(body, "suffix", "suffix"); suffix && !suffix->empty())
      invalid("suffix", "'suffix' is not supported.", "unsupported_value");
    if (auto best_of = integer(body, "best_of", 1, 1 << 20); best_of && *best_of != 1)
      invalid("best_of", "Only best_of=1 is supported.", "unsupported_value");
  }

  if (auto n = integer(body, "n", 1, 16)) r.n = int(*n);
  parse_logit_bias(body, r);
  const int64_t kMaxTokens = int64_t(1) << 30;
  if (auto m = integer(body, "max_tokens", 1, kMaxTokens)) r.max_tokens = *m;
  if (auto m = integer(body, "max_completion_tokens", 1, kMaxTokens)) r.max_tokens = *m;

  auto& s = r.sampling;
  s.temperature = float(number(body, "temperature", 0, 2).value_or(1.0));
  s.top_p = float(number(body, "top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0.0f) invalid("top_p", "'top_p' must be greater than 0.");
  if (auto k = integer(body, "top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = *k < 0 ? 0 : int(*k);
  s.min_p = float(number(body, "min_p", 0, 1).value_or(0.0));
  s.presence_penalty = float(number(body, "presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = float(number(body, "frequency_penalty", -2, 2).value_or(0.0));
  if (auto rp = number(body, "repetition_penalty", 0, 100)) {
    if (*rp <= 0) invalid("repetition_penalty", "'repetition_penalty' must be greater than 0.");
    s.repetition_penalty = float(*rp);
  }
  if (auto seed = integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    s.seed = uint64_t(*seed);
    s.has_seed = true;
  }

  if (const json::value* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.emplace_back(stop->get_string());
    } else if (stop->is_array()) {
      if (stop->get_array().size() > 16) invalid("stop", "At most 16 stop sequences are supported.");
      for (const auto& x : stop->get_array()) {
        if (!x.is_string()) wrong_type("stop", "a string or an array of strings", x);
        r.stop.emplace_back(x.get_string());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *stop);
    }
    for (const auto& x : r.stop)
      if (x.empty()) invalid("stop", "Stop sequences must not be empty.");
  }

  r.stream = boolean(body, "stream").value_or(false);
  if (const json::value* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    static constexpr std::string_view kStreamOptions[] = {"include_usage"};
    reject_unknown_fields(so->get_object(), kStreamOptions, "stream_options");
    if (!r.stream) invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.");
    if (auto u = boolean(so->get_object(), "include_usage")) r.include_usage = *u;
  }

  if (endpoint == Endpoint::chat) {
    const bool logprobs = boolean(body, "logprobs").value_or(false);
    auto top = integer(body, "top_logprobs", 0, 20);
    if (top && !logprobs) invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
    if (logprobs) r.top_logprobs = int(top.value_or(0));
  } else {
    if (auto lp = integer(body, "logprobs", 0, 5)) r.top_logprobs = int(*lp);
  }
  r.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  r.structured_output = parse_response_format(body);
  return r;
}

}  // namespace tierlm::server
