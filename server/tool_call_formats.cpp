#include "server/tool_call_formats.h"

#include <cctype>

#include <boost/json.hpp>

namespace tierlm::server::toolfmt {

namespace json = boost::json;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<json::value> parse_json(std::string_view text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return std::nullopt;
  return v;
}

// Arguments as the API carries them: the JSON text of an object. A string holding an object's JSON is unwrapped.
std::optional<std::string> arguments_text(const json::value* v) {
  if (!v || v->is_null()) return std::string("{}");
  if (v->is_object()) return json::serialize(*v);
  if (v->is_string()) {
    auto inner = parse_json(v->get_string());
    if (inner && inner->is_object()) return json::serialize(*inner);
  }
  return std::nullopt;
}

std::optional<ParsedCall> call_from_object(const json::value& v) {
  if (!v.is_object()) return std::nullopt;
  const auto& o = v.get_object();
  const json::value* name = o.if_contains("name");
  if (!name || !name->is_string() || name->get_string().empty()) return std::nullopt;
  const json::value* args = o.if_contains("arguments");
  if (!args) args = o.if_contains("parameters");
  auto text = arguments_text(args);
  if (!text) return std::nullopt;
  return ParsedCall{std::string(name->get_string()), *text};
}

std::optional<std::vector<ParsedCall>> calls_from_json(std::string_view text) {
  auto v = parse_json(trim(text));
  if (!v) return std::nullopt;
  std::vector<ParsedCall> calls;
  if (v->is_array()) {
    if (v->get_array().empty()) return std::nullopt;
    for (const auto& x : v->get_array()) {
      auto c = call_from_object(x);
      if (!c) return std::nullopt;
      calls.push_back(std::move(*c));
    }
    return calls;
  }
  auto c = call_from_object(*v);
  if (!c) return std::nullopt;
  calls.push_back(std::move(*c));
  return calls;
}

// Llama 3.x: one JSON object, an array of them, or objects separated by ';'.
std::optional<std::vector<ParsedCall>> parse_llama3(std::string_view text) {
  if (auto whole = calls_from_json(text)) return whole;
  std::vector<ParsedCall> calls;
  while (!trim(text).empty()) {
    const size_t semi = text.find(';');
    auto one = calls_from_json(text.substr(0, semi));
    if (!one || one->size() != 1) return std::nullopt;
    calls.push_back(std::move(one->front()));
    if (semi == std::string_view::npos) break;
    text.remove_prefix(semi + 1);
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// The JSON type a tool's schema gives parameter `param` of function `function` ("" when unknown).
std::string schema_type(const json::array& tools, std::string_view function, std::string_view param) {
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const json::value* fn = t.get_object().if_contains("function");
    if (!fn || !fn->is_object()) continue;
    const json::value* name = fn->get_object().if_contains("name");
    if (!name || !name->is_string() || name->get_string() != function) continue;
    const json::value* params = fn->get_object().if_contains("parameters");
    if (!params || !params->is_object()) return {};
    const json::value* props = params->get_object().if_contains("properties");
    if (!props || !props->is_object()) return {};
    const json::value* p = props->get_object().if_contains(param);
    if (!p || !p->is_object()) return {};
    const json::value* type = p->get_object().if_contains("type");
    if (type && type->is_string()) return std::string(type->get_string());
    return {};
  }
  return {};
}

// Qwen3-Coder: <function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n...</function>. `text` starts after "<function=".
std::optional<ParsedCall> parse_xml_function(std::string_view text, const json::array& tools, bool need_close) {
  const size_t gt = text.find('>');
  if (gt == std::string_view::npos) return std::nullopt;
  ParsedCall call;
  call.name = std::string(trim(text.substr(0, gt)));
  if (call.name.empty() || call.name.find_first_of("<\n") != std::string::npos) return std::nullopt;
  text.remove_prefix(gt + 1);
  json::object args;
  for (;;) {
    text = trim(text);
    if (text.empty()) {
      if (need_close) return std::nullopt;
      break;
    }
    if (text.starts_with("</function>")) {
      if (!trim(text.substr(11)).empty()) return std::nullopt;
      break;
    }
    if (!text.starts_with("<parameter=")) return std::nullopt;
    text.remove_prefix(11);
    const size_t pgt = text.find('>');
    if (pgt == std::string_view::npos) return std::nullopt;
    const std::string key(trim(text.substr(0, pgt)));
    text.remove_prefix(pgt + 1);
    const size_t close = text.find("</parameter>");
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view value = text.substr(0, close);
    text.remove_prefix(close + 12);
    if (value.starts_with("\n")) value.remove_prefix(1);
    if (value.ends_with("\n")) value.remove_suffix(1);
    const std::string type = schema_type(tools, call.name, key);
    json::value v = json::string(value);
    if (!type.empty() && type != "string") {
      // Qwen3.5's template writes scalars with Python's str(): True, False and None are what it taught the model.
      const std::string_view t = trim(value);
      if (t == "True" || t == "False") v = t == "True";
      else if (t == "None") v = nullptr;
      else if (auto parsed = parse_json(t)) v = std::move(*parsed);
    }
    args[key] = std::move(v);
  }
  call.arguments = json::serialize(args);
  return call;
}

// Qwen2.5/Qwen3 Hermes-style JSON; also `NAME {json}`, the embedded default model's own template's form.
std::optional<std::vector<ParsedCall>> parse_hermes(std::string_view body) {
  if (auto calls = calls_from_json(body)) return calls;
  body = trim(body);
  const size_t space = body.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view name = body.substr(0, space);
  if (name.empty() || name.find_first_of("{}[]\"<>") != std::string_view::npos) return std::nullopt;
  auto v = parse_json(trim(body.substr(space + 1)));
  if (!v || !v->is_object()) return std::nullopt;
  return std::vector<ParsedCall>{ParsedCall{std::string(name), json::serialize(*v)}};
}

std::optional<std::vector<ParsedCall>> parse_qwen_xml(const BlockMarker& marker, std::string_view body,
                                                      const json::array& tools) {
  if (marker.open == "<function=") {
    auto c = parse_xml_function(body, tools, /*need_close=*/false);
    if (!c) return std::nullopt;
    return std::vector<ParsedCall>{std::move(*c)};
  }
  body = trim(body);
  if (!body.starts_with("<function=")) {
    // Some checkpoints put Hermes JSON inside the same <tool_call> tags.
    return calls_from_json(body);
  }
  auto c = parse_xml_function(body.substr(10), tools, /*need_close=*/true);
  if (!c) return std::nullopt;
  return std::vector<ParsedCall>{std::move(*c)};
}

// Mistral: [TOOL_CALLS][{"name":..,"arguments":{..}}, ...] (v3), or NAME[ARGS]{..} per [TOOL_CALLS] (v11+), with an
// optional [CALL_ID]id before [ARGS].
std::optional<std::vector<ParsedCall>> parse_mistral(std::string_view body) {
  const std::string_view t = trim(body);
  if (t.starts_with("[") || t.starts_with("{")) {
    // v3: one array (several [TOOL_CALLS] arrays are joined by the model only rarely; each must parse).
    std::vector<ParsedCall> all;
    std::string_view rest = t;
    for (;;) {
      const size_t next = rest.find("[TOOL_CALLS]");
      auto part = calls_from_json(rest.substr(0, next));
      if (!part) return std::nullopt;
      for (auto& c : *part) all.push_back(std::move(c));
      if (next == std::string_view::npos) break;
      rest = rest.substr(next + 12);
    }
    return all;
  }
  std::vector<ParsedCall> calls;
  std::string_view rest = body;
  for (;;) {
    const size_t next = rest.find("[TOOL_CALLS]");
    std::string_view part = trim(rest.substr(0, next));
    const size_t args_at = part.find("[ARGS]");
    if (args_at == std::string_view::npos) return std::nullopt;
    std::string_view name = part.substr(0, args_at);
    if (const size_t id_at = name.find("[CALL_ID]"); id_at != std::string_view::npos) name = name.substr(0, id_at);
    name = trim(name);
    if (name.empty()) return std::nullopt;
    auto v = parse_json(trim(part.substr(args_at + 6)));
    if (!v || !v->is_object()) return std::nullopt;
    calls.push_back(ParsedCall{std::string(name), json::serialize(*v)});
    if (next == std::string_view::npos) break;
    rest = rest.substr(next + 12);
  }
  return calls;
}

// DeepSeek-V3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{..}\n```<｜tool▁call▁end｜> per call;
// V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>.
std::optional<std::vector<ParsedCall>> parse_deepseek(std::string_view body) {
  static const std::string kBegin = "<｜tool▁call▁begin｜>", kEnd = "<｜tool▁call▁end｜>", kSep = "<｜tool▁sep｜>";
  std::vector<ParsedCall> calls;
  std::string_view rest = body;
  for (;;) {
    rest = trim(rest);
    if (rest.empty()) break;
    if (!rest.starts_with(kBegin)) return std::nullopt;
    rest.remove_prefix(kBegin.size());
    const size_t end = rest.find(kEnd);
    if (end == std::string_view::npos) return std::nullopt;
    std::string_view call = rest.substr(0, end);
    rest.remove_prefix(end + kEnd.size());
    const size_t sep = call.find(kSep);
    if (sep == std::string_view::npos) return std::nullopt;
    std::string_view head = trim(call.substr(0, sep)), tail = call.substr(sep + kSep.size());
    std::string_view name, args;
    if (head == "function") {
      const size_t nl = tail.find('\n');
      if (nl == std::string_view::npos) return std::nullopt;
      name = trim(tail.substr(0, nl));
      args = trim(tail.substr(nl + 1));
      if (args.starts_with("```json")) args.remove_prefix(7);
      else if (args.starts_with("```")) args.remove_prefix(3);
      if (args.ends_with("```")) args.remove_suffix(3);
    } else {
      name = head;
      args = tail;
    }
    auto v = parse_json(trim(args));
    if (name.empty() || !v || !v->is_object()) return std::nullopt;
    calls.push_back(ParsedCall{std::string(name), json::serialize(*v)});
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// Gemma 4 values: <|"|>text<|"|>, "json string", numbers, true/false/null, {k:v,...}, [v,...].
struct GemmaReader {
  std::string_view s;
  size_t i = 0;
  static constexpr std::string_view kQuote = "<|\"|>";
  void skip_ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    skip_ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  std::optional<json::value> value(int depth) {
    if (depth > 64) return std::nullopt;
    skip_ws();
    if (i >= s.size()) return std::nullopt;
    if (s.substr(i).starts_with(kQuote)) {
      const size_t end = s.find(kQuote, i + kQuote.size());
      if (end == std::string_view::npos) return std::nullopt;
      json::value v = json::string(s.substr(i + kQuote.size(), end - i - kQuote.size()));
      i = end + kQuote.size();
      return v;
    }
    const char c = s[i];
    if (c == '{') {
      ++i;
      json::object o;
      if (eat('}')) return json::value(std::move(o));
      for (;;) {
        skip_ws();
        std::string key;
        if (s.substr(i).starts_with(kQuote)) {
          auto k = value(depth + 1);
          if (!k || !k->is_string()) return std::nullopt;
          key = std::string(k->get_string());
        } else {
          const size_t colon = s.find(':', i);
          if (colon == std::string_view::npos) return std::nullopt;
          std::string_view k = trim(s.substr(i, colon - i));
          if (k.size() >= 2 && k.front() == '"' && k.back() == '"') k = k.substr(1, k.size() - 2);
          if (k.empty() || k.find_first_of("{}[],") != std::string_view::npos) return std::nullopt;
          key = std::string(k);
          i = colon;
        }
        if (!eat(':')) return std::nullopt;
        auto v = value(depth + 1);
        if (!v) return std::nullopt;
        o[key] = std::move(*v);
        if (eat(',')) continue;
        if (eat('}')) return json::value(std::move(o));
        return std::nullopt;
      }
    }
    if (c == '[') {
      ++i;
      json::array a;
      if (eat(']')) return json::value(std::move(a));
      for (;;) {
        auto v = value(depth + 1);
        if (!v) return std::nullopt;
        a.push_back(std::move(*v));
        if (eat(',')) continue;
        if (eat(']')) return json::value(std::move(a));
        return std::nullopt;
      }
    }
    // A scalar: a JSON string, number or literal, up to the next delimiter.
    size_t end = i;
    if (c == '"') {
      end = i + 1;
      while (end < s.size() && s[end] != '"') end += s[end] == '\\' ? 2 : 1;
      if (end >= s.size()) return std::nullopt;
      ++end;
    } else {
      while (end < s.size() && s[end] != ',' && s[end] != '}' && s[end] != ']') ++end;
    }
    auto v = parse_json(trim(s.substr(i, end - i)));
    if (!v || v->is_object() || v->is_array()) return std::nullopt;
    i = end;
    return v;
  }
};

std::optional<std::vector<ParsedCall>> parse_gemma4(std::string_view body) {
  body = trim(body);
  if (!body.starts_with("call:")) return std::nullopt;
  body.remove_prefix(5);
  const size_t brace = body.find('{');
  if (brace == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(body.substr(0, brace));
  if (name.empty()) return std::nullopt;
  auto args = gemma4_arguments_to_json(body.substr(brace));
  if (!args) return std::nullopt;
  return std::vector<ParsedCall>{ParsedCall{std::string(name), *args}};
}

}  // namespace

std::optional<ParsedCall> call_from_json_object(std::string_view json_text) {
  auto v = parse_json(trim(json_text));
  if (!v) return std::nullopt;
  return call_from_object(*v);
}

std::optional<std::string> gemma4_arguments_to_json(std::string_view text) {
  GemmaReader r{text};
  auto v = r.value(0);
  r.skip_ws();
  if (!v || !v->is_object() || r.i != text.size()) return std::nullopt;
  return json::serialize(*v);
}

std::vector<BlockMarker> block_markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::hermes: return {{"<tool_call>", "</tool_call>"}};
    case ToolCallFormat::qwen_xml: return {{"<tool_call>", "</tool_call>"}, {"<function=", "</function>"}};
    case ToolCallFormat::llama3_json: return {{"<|python_tag|>", ""}, {"{", "", true}};
    case ToolCallFormat::mistral: return {{"[TOOL_CALLS]", ""}};
    case ToolCallFormat::gemma4: return {{"<|tool_call>", "<tool_call|>"}};
    case ToolCallFormat::deepseek_v3: return {{"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"}};
    case ToolCallFormat::none:
    case ToolCallFormat::harmony: return {};
  }
  return {};
}

std::optional<std::vector<ParsedCall>> parse_block(ToolCallFormat format, const BlockMarker& marker,
                                                   std::string_view body, const json::array& tools) {
  switch (format) {
    case ToolCallFormat::hermes: return parse_hermes(body);
    case ToolCallFormat::qwen_xml: return parse_qwen_xml(marker, body, tools);
    case ToolCallFormat::llama3_json: {
      if (marker.open != "{") return parse_llama3(body);
      std::string text(1, '{');  // the opening brace was the marker: it belongs to the JSON
      text.append(body);
      return parse_llama3(text);
    }
    case ToolCallFormat::mistral: return parse_mistral(body);
    case ToolCallFormat::gemma4: return parse_gemma4(body);
    case ToolCallFormat::deepseek_v3: return parse_deepseek(body);
    case ToolCallFormat::none:
    case ToolCallFormat::harmony: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace tierlm::server::toolfmt
