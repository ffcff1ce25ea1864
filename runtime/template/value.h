// Value: what a chat template computes with. A small Python-like variant (undefined, none, bool, int, float, str,
// list/tuple, dict with insertion order, namespace, callable) whose printing, comparison, truthiness and JSON
// dumping follow Python's rules, because the oracle is python3-jinja2 and the outputs must match byte for byte.
// Lists and dicts are shared and immutable once built (the sandbox forbids mutating them); only namespaces change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <boost/json/value.hpp>

#include "runtime/template/template_error.h"

namespace tierlm::tmpl {

class Value;
class Interpreter;

struct List {
  std::vector<Value> items;
  bool tuple = false;  // prints as (a, b) instead of [a, b]
};

// Python dict: keys are strings here (chat templates never need others), order of first insertion kept.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

struct Namespace {
  Dict attributes;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  Interpreter* interpreter = nullptr;
  // Takes positional i or keyword `name`, else nullopt; marks keyword ones used so leftovers can be reported.
  std::optional<Value> take(std::size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

// Jinja's Undefined: falsy, prints empty, iterates empty, and raises with `message` on most other uses.
struct Undefined {
  std::string message;
  bool unsafe = false;  // a sandbox-forbidden attribute: using it is a SecurityError
};

class Value {
 public:
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
                               std::shared_ptr<Dict>, std::shared_ptr<Namespace>, std::shared_ptr<Callable>>;

  Value() : v_(Undefined{}) {}
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(std::shared_ptr<List> l) : v_(std::move(l)) {}
  Value(std::shared_ptr<Dict> d) : v_(std::move(d)) {}
  Value(std::shared_ptr<Namespace> n) : v_(std::move(n)) {}
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}

  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(Dict d = {});
  static Value undefined(std::string message) { return Value(Undefined{std::move(message), false}); }
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Python's float(x) for int/bool/float.
  double to_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const List& as_list() const { return *std::get<std::shared_ptr<List>>(v_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(v_); }

  // Raises the TemplateError an undefined value carries (UndefinedError / SecurityError in jinja2).
  [[noreturn]] void fail_undefined() const;

  bool truthy() const;
  // Python's type name as jinja2 reports it ("dict", "list", "str", "int", "NoneType", ...).
  std::string type_name() const;

 private:
  Storage v_;
};

// Python's str(): strings as is, None -> "None", True -> "True", containers as repr. Undefined -> "".
std::string to_str(const Value& v);
// Python's repr().
std::string to_repr(const Value& v);
// Python's repr() of a float.
std::string float_repr(double d);
// Python's repr() of a str: quotes and escapes as CPython does.
std::string string_repr(std::string_view s);
// Python's ==.
bool equals(const Value& a, const Value& b);
// Python's <; throws TemplateError (TypeError) for unorderable operands.
bool less_than(const Value& a, const Value& b);

struct JsonOptions {
  std::optional<std::string> indent;  // nullopt: one line; else the indent unit
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps with the given options; throws TemplateError for values JSON cannot hold.
std::string to_json(const Value& v, const JsonOptions& options);

Value from_json(const boost::json::value& v);

}  // namespace tierlm::tmpl
