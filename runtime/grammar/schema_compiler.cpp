// The JSON Schema -> grammar compiler (and the json_object and tool-call grammars built from the same nodes).
#include <map>
#include <set>

#include <boost/json.hpp>
#include <fmt/format.h>

#include "runtime/grammar/grammar_nodes.h"

namespace tierlm::grammar {

namespace json = boost::json;

namespace {

// Keywords that only annotate: accepted and ignored (they never restrict the instance).
const std::set<std::string, std::less<>> kAnnotations = {"title", "description", "default", "examples", "$schema",
                                                          "$id", "$comment", "$defs", "definitions", "deprecated",
                                                          "readOnly", "writeOnly"};
const std::set<std::string, std::less<>> kImplemented = {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "oneOf", "allOf",
    "$ref", "minItems", "maxItems", "minLength", "maxLength"};

[[noreturn]] void fail(const std::string& keyword, const std::string& message) { throw SchemaError(keyword, message); }

class Compiler {
 public:
  explicit Compiler(const json::value* root_schema) : root_schema_(root_schema) {}

  Grammar& grammar() { return *grammar_; }
  std::shared_ptr<Grammar> take() { return std::move(grammar_); }

  int32_t add(Node node) {
    grammar_->nodes.push_back(std::move(node));
    return int32_t(grammar_->nodes.size() - 1);
  }
  int32_t literal(std::string bytes) {
    Node n;
    n.kind = NodeKind::literal;
    n.bytes = std::move(bytes);
    return add(std::move(n));
  }
  int32_t string_node(int32_t min, int32_t max) {
    Node n;
    n.kind = NodeKind::string;
    n.min = min;
    n.max = max;
    return add(std::move(n));
  }
  int32_t number_node(bool integer) {
    Node n;
    n.kind = NodeKind::number;
    n.integer = integer;
    return add(std::move(n));
  }
  int32_t choice(std::vector<int32_t> alternatives) {
    if (alternatives.size() == 1) return alternatives[0];
    Node n;
    n.kind = NodeKind::choice;
    n.children = std::move(alternatives);
    return add(std::move(n));
  }
  int32_t sequence(std::vector<int32_t> items) {
    Node n;
    n.kind = NodeKind::sequence;
    n.children = std::move(items);
    return add(std::move(n));
  }
  int32_t map_of(int32_t value) {
    Node n;
    n.kind = NodeKind::map;
    n.children = {value, plain_string()};
    return add(std::move(n));
  }
  int32_t array_of(int32_t item, int32_t min, int32_t max) {
    Node n;
    n.kind = NodeKind::array;
    n.children = {item};
    n.min = min;
    n.max = max;
    return add(std::move(n));
  }

  // Any JSON value (an empty schema, `true`, json_object's member values).
  int32_t any_value() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = add(Node{NodeKind::choice, {}, 0, -1, false, {}, {}});
    const int32_t object = map_of(any_value_);
    const int32_t array = array_of(any_value_, 0, -1);
    std::vector<int32_t> alternatives = {object, array, plain_string(), number_node(false), literal("true"),
                                         literal("false"), literal("null")};
    grammar_->nodes[size_t(any_value_)].children = std::move(alternatives);
    return any_value_;
  }
  int32_t any_object() { return map_of(any_value()); }

  int32_t schema(const json::value& s, const std::string& where);

 private:
  int32_t plain_string() {
    if (plain_string_ < 0) plain_string_ = string_node(0, -1);
    return plain_string_;
  }
  int32_t reference(const std::string& ref, const std::string& where);
  int32_t typed(const std::string& type, const json::object& s, const std::string& where);
  int32_t object_schema(const json::object& s, const std::string& where);
  int32_t array_schema(const json::object& s, const std::string& where);
  int32_t string_schema(const json::object& s, const std::string& where);
  int32_t values(const json::array& allowed, const json::object& s, const std::string& where);

  const json::value* root_schema_;
  std::shared_ptr<Grammar> grammar_ = std::make_shared<Grammar>();
  int32_t any_value_ = -1;
  int32_t plain_string_ = -1;
  std::map<std::string, int32_t> references_;  // $ref -> its node (a choice of one, filled after compiling)
};

int32_t non_negative(const json::object& s, std::string_view key, const std::string& where, int32_t fallback) {
  const json::value* v = s.if_contains(key);
  if (!v) return fallback;
  if (v->is_int64() && v->get_int64() >= 0 && v->get_int64() <= (1 << 30)) return int32_t(v->get_int64());
  if (v->is_uint64() && v->get_uint64() <= (1u << 30)) return int32_t(v->get_uint64());
  if (v->is_double() && v->get_double() >= 0 && v->get_double() <= (1 << 30) &&
      v->get_double() == double(int64_t(v->get_double())))
    return int32_t(v->get_double());
  fail(std::string(key), fmt::format("'{}' at {} must be a non-negative integer.", key, where));
}

bool matches_type(const json::value& v, std::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_bool();
  if (type == "string") return v.is_string();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_int64() || v.is_uint64() || (v.is_double() && v.get_double() == double(int64_t(v.get_double())));
  return false;
}

std::vector<std::string> types_of(const json::object& s, const std::string& where) {
  std::vector<std::string> types;
  const json::value* t = s.if_contains("type");
  if (!t) return types;
  auto one = [&](const json::value& v) {
    static const std::set<std::string, std::less<>> known = {"object", "array", "string", "number",
                                                             "integer", "boolean", "null"};
    if (!v.is_string() || !known.count(v.get_string()))
      fail("type", fmt::format("'type' at {} must be one of object, array, string, number, integer, boolean, null "
                               "(or an array of them), got {}.", where, json::serialize(v)));
    types.emplace_back(v.get_string());
  };
  if (t->is_array()) {
    if (t->get_array().empty()) fail("type", fmt::format("'type' at {} is an empty array.", where));
    for (const auto& v : t->get_array()) one(v);
  } else {
    one(*t);
  }
  return types;
}

int32_t Compiler::schema(const json::value& value, const std::string& where) {
  if (value.is_bool()) {
    if (value.get_bool()) return any_value();
    fail("false", fmt::format("The schema at {} is `false`: nothing can match it.", where));
  }
  if (!value.is_object())
    fail("schema", fmt::format("The schema at {} must be an object or a boolean, got {}.", where,
                               json::serialize(value)));
  const json::object& s = value.as_object();
  std::vector<std::string> constraining;  // implemented keywords present, besides annotations
  for (const auto& [key, v] : s) {
    if (kAnnotations.count(key)) continue;
    if (!kImplemented.count(key))
      fail(std::string(key), fmt::format("The JSON Schema keyword '{}' (at {}) is not supported for structured output.",
                                         std::string(key), where));
    constraining.emplace_back(key);
  }
  auto alone = [&](const char* keyword) {
    if (constraining.size() != 1)
      fail(keyword, fmt::format("'{}' at {} combined with other keywords is not supported; move them into each "
                                "branch.", keyword, where));
  };
  if (const json::value* ref = s.if_contains("$ref")) {
    alone("$ref");
    if (!ref->is_string()) fail("$ref", fmt::format("'$ref' at {} must be a string.", where));
    return reference(std::string(ref->get_string()), where);
  }
  for (const char* keyword : {"anyOf", "oneOf", "allOf"}) {
    const json::value* branches = s.if_contains(keyword);
    if (!branches) continue;
    alone(keyword);
    if (!branches->is_array() || branches->get_array().empty())
      fail(keyword, fmt::format("'{}' at {} must be a non-empty array of schemas.", keyword, where));
    const json::array& a = branches->get_array();
    if (std::string_view(keyword) == "allOf") {
      if (a.size() != 1) fail("allOf", fmt::format("'allOf' at {} with more than one schema is not supported.", where));
      return schema(a[0], where + "/allOf/0");
    }
    std::vector<int32_t> alternatives;
    for (size_t i = 0; i < a.size(); ++i)
      alternatives.push_back(schema(a[i], fmt::format("{}/{}/{}", where, keyword, i)));
    return choice(std::move(alternatives));
  }
  if (const json::value* c = s.if_contains("const")) return values(json::array{*c}, s, where);
  if (const json::value* e = s.if_contains("enum")) {
    if (!e->is_array() || e->get_array().empty())
      fail("enum", fmt::format("'enum' at {} must be a non-empty array.", where));
    return values(e->get_array(), s, where);
  }

  std::vector<std::string> types = types_of(s, where);
  if (types.empty()) {
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) types = {"object"};
    else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) types = {"array"};
    else if (s.contains("minLength") || s.contains("maxLength")) types = {"string"};
    else return any_value();
  }
  std::vector<int32_t> alternatives;
  for (const auto& type : types) alternatives.push_back(typed(type, s, where));
  return choice(std::move(alternatives));
}

int32_t Compiler::typed(const std::string& type, const json::object& s, const std::string& where) {
  if (type == "object") return object_schema(s, where);
  if (type == "array") return array_schema(s, where);
  if (type == "string") return string_schema(s, where);
  if (type == "number") return number_node(false);
  if (type == "integer") return number_node(true);
  if (type == "boolean") return choice({literal("true"), literal("false")});
  return literal("null");
}

int32_t Compiler::object_schema(const json::object& s, const std::string& where) {
  Node n;
  n.kind = NodeKind::object;
  std::vector<std::string> names;
  std::vector<const json::value*> schemas;
  if (const json::value* p = s.if_contains("properties")) {
    if (!p->is_object()) fail("properties", fmt::format("'properties' at {} must be an object.", where));
    for (const auto& [name, sub] : p->get_object()) {
      names.emplace_back(name);
      schemas.push_back(&sub);
    }
  }
  std::set<std::string> required;
  if (const json::value* r = s.if_contains("required")) {
    if (!r->is_array()) fail("required", fmt::format("'required' at {} must be an array of strings.", where));
    for (const auto& x : r->get_array()) {
      if (!x.is_string()) fail("required", fmt::format("'required' at {} must be an array of strings.", where));
      required.emplace(x.get_string());
    }
  }
  const json::value* additional = s.if_contains("additionalProperties");
  if (additional && !additional->is_bool() && !additional->is_object())
    fail("additionalProperties", fmt::format("'additionalProperties' at {} must be a boolean or a schema.", where));
  const bool closed = additional && additional->is_bool() && !additional->get_bool();
  for (const auto& name : required) {
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    if (closed)
      fail("required", fmt::format("'required' at {} names '{}', which 'additionalProperties': false forbids.", where,
                                   name));
    names.push_back(name);  // required but not described: any value
    schemas.push_back(nullptr);
  }
  if (names.empty() && !closed) {
    // No declared members: a map of the additional properties' schema (any value by default).
    return map_of(additional && additional->is_object() ? schema(*additional, where + "/additionalProperties")
                                                        : any_value());
  }
  // Declared members only (a subset of what additionalProperties true or a schema would allow: still valid).
  for (size_t i = 0; i < names.size(); ++i) {
    Node member;
    member.kind = NodeKind::member;
    member.bytes = json::serialize(json::value(json::string(names[i]))) + ":";
    member.children = {schemas[i] ? schema(*schemas[i], where + "/properties/" + names[i]) : any_value()};
    n.children.push_back(add(std::move(member)));
    n.required.push_back(required.count(names[i]) > 0);
  }
  return add(std::move(n));
}

int32_t Compiler::array_schema(const json::object& s, const std::string& where) {
  const int32_t min = non_negative(s, "minItems", where, 0);
  const int32_t max = non_negative(s, "maxItems", where, -1);
  if (max >= 0 && max < min) fail("maxItems", fmt::format("'maxItems' at {} is below 'minItems'.", where));
  const json::value* items = s.if_contains("items");
  if (items && items->is_bool() && !items->get_bool()) {
    if (min > 0) fail("items", fmt::format("'items': false at {} with minItems > 0 matches nothing.", where));
    return literal("[]");
  }
  const int32_t item = items ? schema(*items, where + "/items") : any_value();
  return array_of(item, min, max);
}

int32_t Compiler::string_schema(const json::object& s, const std::string& where) {
  const int32_t min = non_negative(s, "minLength", where, 0);
  const int32_t max = non_negative(s, "maxLength", where, -1);
  if (max >= 0 && max < min) fail("maxLength", fmt::format("'maxLength' at {} is below 'minLength'.", where));
  return string_node(min, max);
}

// enum / const: each allowed value as its compact JSON text (only those of the schema's type, when it gives one).
int32_t Compiler::values(const json::array& allowed, const json::object& s, const std::string& where) {
  const std::vector<std::string> types = types_of(s, where);
  std::vector<int32_t> alternatives;
  std::set<std::string> seen;
  for (const auto& v : allowed) {
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const auto& t) { return matches_type(v, t); }))
      continue;
    std::string text = json::serialize(v);
    if (seen.insert(text).second) alternatives.push_back(literal(std::move(text)));
  }
  const char* keyword = s.contains("const") ? "const" : "enum";
  if (alternatives.empty()) fail(keyword, fmt::format("No value of '{}' at {} matches its 'type'.", keyword, where));
  return choice(std::move(alternatives));
}

int32_t Compiler::reference(const std::string& ref, const std::string& where) {
  if (auto it = references_.find(ref); it != references_.end()) return it->second;
  const json::value* target = nullptr;
  if (ref == "#") {
    target = root_schema_;
  } else {
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(prefix, 0) != 0 || !root_schema_ || !root_schema_->is_object()) continue;
      const std::string section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
      const json::value* defs = root_schema_->as_object().if_contains(section);
      const std::string name = ref.substr(std::string(prefix).size());
      if (defs && defs->is_object()) target = defs->as_object().if_contains(name);
    }
  }
  if (!target)
    fail("$ref", fmt::format("'$ref' {} at {} is not supported: only #, #/$defs/NAME and #/definitions/NAME of this "
                             "schema (without '/' or '~' escapes in NAME) resolve.", ref, where));
  // A choice of one placeholder first, so a recursive reference finds it while the target compiles.
  const int32_t placeholder = add(Node{NodeKind::choice, {}, 0, -1, false, {}, {}});
  references_[ref] = placeholder;
  const int32_t body = schema(*target, ref);
  grammar_->nodes[size_t(placeholder)].children = {body};
  return placeholder;
}

std::shared_ptr<const Grammar> finish(Compiler& compiler, int32_t value) {
  compiler.grammar().root = compiler.sequence({value});
  return compiler.take();
}

}  // namespace

std::shared_ptr<const Grammar> compile_json_schema(const json::value& schema) {
  Compiler compiler(&schema);
  return finish(compiler, compiler.schema(schema, "#"));
}

std::shared_ptr<const Grammar> compile_json_object() {
  Compiler compiler(nullptr);
  return finish(compiler, compiler.any_object());
}

ToolCallForm qwen_tool_call(std::string_view function_name, const json::value& parameters) {
  ToolCallForm form;
  form.prefix = "<tool_call>\n{\"name\": " + json::serialize(json::value(json::string(function_name))) +
                ", \"arguments\": ";
  form.parameters = parameters;
  form.suffix = "}\n</tool_call>";
  return form;
}

std::shared_ptr<const Grammar> compile_tool_calls(std::span<const ToolCallForm> forms, bool parallel,
                                                  std::string_view separator) {
  if (forms.empty()) throw std::invalid_argument("compile_tool_calls: no tool call forms");
  // One compiler for all forms: each form's $refs resolve against its own parameters schema.
  Compiler any(nullptr);
  std::vector<int32_t> calls;
  for (size_t i = 0; i < forms.size(); ++i) {
    Compiler own(&forms[i].parameters);
    const int32_t value = own.schema(forms[i].parameters, "#");
    // Move the form's nodes into the shared grammar, shifting their indices.
    const int32_t offset = int32_t(any.grammar().nodes.size());
    for (Node node : own.grammar().nodes) {
      for (auto& child : node.children) child += offset;
      any.add(std::move(node));
    }
    std::vector<int32_t> items;
    if (!forms[i].prefix.empty()) items.push_back(any.literal(forms[i].prefix));
    items.push_back(value + offset);
    if (!forms[i].suffix.empty()) items.push_back(any.literal(forms[i].suffix));
    calls.push_back(any.sequence(std::move(items)));
  }
  int32_t body = any.choice(std::move(calls));
  if (parallel) {
    if (separator.empty()) throw std::invalid_argument("compile_tool_calls: parallel calls need a separator");
    Node repeat;
    repeat.kind = NodeKind::repeat;
    repeat.children = {body, any.literal(std::string(separator))};
    body = any.add(std::move(repeat));
  }
  return finish(any, body);
}

}  // namespace tierlm::grammar
