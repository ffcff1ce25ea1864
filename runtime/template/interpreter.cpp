#include "runtime/template/interpreter.h"

#include <cmath>
#include <limits>
#include <ctime>

#include "runtime/template/builtins.h"
#include "runtime/template/text.h"

namespace tierlm::tmpl {

const Value* Scope::lookup(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    if (const Value* v = s->vars.find(name)) return v;
  return nullptr;
}

namespace {

// jinja2's object_type_repr, used in undefined messages.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  return v.type_name() + " object";
}

Value missing_attribute(const Value& object, const std::string& name) {
  return Value::undefined(string_repr(object_type_repr(object)) + " has no attribute " + string_repr(name));
}

Value missing_element(const Value& object, const Value& key) {
  return Value::undefined(string_repr(object_type_repr(object)) + " has no element " + to_repr(key));
}

Value unsafe(const Value& object, const std::string& name) {
  return Value(Undefined{"access to attribute " + string_repr(name) + " of " + string_repr(object.type_name()) +
                             " object is unsafe.",
                         true});
}

int64_t as_index(const Value& v) { return v.is_bool() ? int64_t(v.as_bool()) : v.as_int(); }

// Python slice index adjustment (PySlice_AdjustIndices) for a sequence of length n.
std::vector<std::size_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto opt = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.is_int() || v.is_bool()) return as_index(v);
    throw TemplateError("slice indices must be integers or None");
  };
  int64_t step = opt(step_v).value_or(1);
  if (step == 0) throw TemplateError("slice step cannot be zero");
  auto start_o = opt(start_v), stop_o = opt(stop_v);
  int64_t start, stop;
  if (step > 0) {
    start = start_o.value_or(0);
    stop = stop_o.value_or(n);
    if (start < 0) start = std::max<int64_t>(0, start + n);
    if (stop < 0) stop = std::max<int64_t>(0, stop + n);
    start = std::min(start, n);
    stop = std::min(stop, n);
  } else {
    start = start_o.value_or(n - 1);
    stop = stop_o.value_or(-n - 1);
    if (start < 0) start = std::max<int64_t>(-1, start + n);
    if (stop < 0) stop = std::max<int64_t>(-1, stop + n);
    start = std::min(start, n - 1);
    stop = std::min(stop, n - 1);
  }
  std::vector<std::size_t> out;
  // Step before adding: start + step can pass INT64_MAX when the step is huge ("abc"[::9223372036854775807]).
  if (step > 0)
    for (int64_t i = start; i < stop; i += step) {
      out.push_back(static_cast<std::size_t>(i));
      if (step >= stop - i) break;
    }
  else
    for (int64_t i = start; i > stop; i += step) {
      out.push_back(static_cast<std::size_t>(i));
      if (step <= stop - i) break;
    }
  return out;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return int_neg(a);  // INT64_MIN / -1 does not fit
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

void Interpreter::check_size(std::size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    throw TemplateError("template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
}

void Interpreter::count_iterations(std::size_t n) {
  iterations_ = n > std::numeric_limits<std::size_t>::max() - iterations_ ? std::numeric_limits<std::size_t>::max() : iterations_ + n;
  if (iterations_ > limits_.max_loop_iterations)
    throw TemplateError("template exceeds " + std::to_string(limits_.max_loop_iterations) + " loop iterations");
}

void Interpreter::append(std::string& out, std::string_view text) const {
  check_size(out.size() + text.size());
  out.append(text);
}

void Interpreter::rethrow_at(const TemplateError& e, std::size_t offset) const {
  if (e.line() > 0) throw e;
  auto [line, column] = line_column(parsed_.source, offset);
  throw TemplateError(e.message(), line, column);
}

Interpreter::~Interpreter() {
  for (const auto& ns : namespaces_) ns->attributes.entries.clear();
}

std::string Interpreter::render(const Dict& context) {
  auto globals = std::make_shared<Scope>();
  install_globals(globals->vars);
  auto root = std::make_shared<Scope>();
  root->parent = globals;
  root->vars = context;
  std::string out;
  exec(parsed_.body, root, out);
  return out;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& stmt : body) {
    Flow f = exec_stmt(*stmt, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  try {
    switch (s.kind) {
      case Stmt::Kind::Text:
        append(out, s.text);
        break;
      case Stmt::Kind::Print: {
        Value v = eval(*s.expr, scope);
        if (v.is_string())
          append(out, v.as_string());
        else
          append(out, to_str(v));
        break;
      }
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches) {
          Value c = eval(*cond, scope);
          if (c.truthy()) return exec(body, scope, out);
        }
        return exec(s.else_body, scope, out);
      case Stmt::Kind::For:
        exec_for(s, scope, out);
        break;
      case Stmt::Kind::Set:
        assign(s.target, eval(*s.expr, scope), scope, s.offset);
        break;
      case Stmt::Kind::SetBlock: {
        std::string text;
        exec(s.body, scope, text);
        Value v(std::move(text));
        if (s.filter) v = run_filter_expr(*s.filter, v, scope);
        assign(s.target, v, scope, s.offset);
        break;
      }
      case Stmt::Kind::Macro:
        scope->vars.set(s.name, make_macro(s, scope));
        break;
      case Stmt::Kind::CallBlock: {
        const Expr& call_expr = *s.expr;
        Value callee = eval(*call_expr.args[0], scope);
        CallArgs args = eval_args(call_expr, scope, 1);
        // caller(): renders the block body with the caller's parameters, in the calling scope.
        const Stmt* stmt = &s;
        ScopePtr defining = scope;
        args.keyword.emplace_back("caller", Value::function("caller", [this, stmt, defining](const CallArgs& a) {
          if (++call_depth_ > limits_.max_call_depth) {
            --call_depth_;
            throw TemplateError("macro calls nest deeper than " + std::to_string(limits_.max_call_depth));
          }
          auto local = std::make_shared<Scope>();
          local->parent = defining;
          for (std::size_t i = 0; i < stmt->params.size(); ++i) {
            auto v = a.take(i, stmt->params[i].name);
            if (v) local->vars.set(stmt->params[i].name, *v);
            else if (stmt->params[i].default_value) local->vars.set(stmt->params[i].name, eval(*stmt->params[i].default_value, local));
            else local->vars.set(stmt->params[i].name, Value::undefined("parameter " + string_repr(stmt->params[i].name) + " was not provided"));
          }
          std::string text;
          exec(stmt->body, local, text);
          --call_depth_;
          return Value(std::move(text));
        }));
        args.interpreter = this;
        Value v = call(callee, args);
        append(out, to_str(v));
        break;
      }
      case Stmt::Kind::FilterBlock: {
        std::string text;
        exec(s.body, scope, text);
        append(out, to_str(run_filter_expr(*s.filter, Value(std::move(text)), scope)));
        break;
      }
      case Stmt::Kind::With: {
        auto local = std::make_shared<Scope>();
        local->parent = scope;
        for (const auto& [target, expr] : s.assignments) assign(target, eval(*expr, scope), local, s.offset);
        return exec(s.body, local, out);
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::Scope:
        return exec(s.body, scope, out);
    }
  } catch (const TemplateError& e) {
    rethrow_at(e, s.offset);
  }
  return Flow::Normal;
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope) {
  const Stmt* stmt = &s;
  std::weak_ptr<Scope> weak = scope;  // the macro lives in that scope: a strong ref would be a cycle
  return Value::function(s.name, [this, stmt, weak](const CallArgs& args) {
    ScopePtr defining = weak.lock();
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      throw TemplateError("macro calls nest deeper than " + std::to_string(limits_.max_call_depth));
    }
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{call_depth_};
    auto local = std::make_shared<Scope>();
    local->parent = defining;
    const auto& params = stmt->params;
    std::vector<bool> used(args.keyword.size(), false);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name;
      std::optional<Value> v;
      if (i < args.positional.size()) v = args.positional[i];
      for (std::size_t k = 0; k < args.keyword.size(); ++k)
        if (args.keyword[k].first == name) {
          v = args.keyword[k].second;
          used[k] = true;
        }
      if (v)
        local->vars.set(name, *v);
      else if (params[i].default_value)
        local->vars.set(name, eval(*params[i].default_value, local));
      else
        local->vars.set(name, Value::undefined("parameter " + string_repr(name) + " was not provided"));
    }
    std::vector<Value> varargs;
    for (std::size_t i = params.size(); i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
    Dict kwargs;
    for (std::size_t k = 0; k < args.keyword.size(); ++k)
      if (!used[k] && args.keyword[k].first != "caller") kwargs.set(args.keyword[k].first, args.keyword[k].second);
      else if (args.keyword[k].first == "caller") local->vars.set("caller", args.keyword[k].second);
    local->vars.set("varargs", Value::list(std::move(varargs), true));
    local->vars.set("kwargs", Value::dict(std::move(kwargs)));
    std::string text;
    exec(stmt->body, local, text);
    return Value(std::move(text));
  });
}

void Interpreter::assign(const Target& target, const Value& value, const ScopePtr& scope, std::size_t offset) {
  if (!target.attribute.empty()) {
    const Value* ns = scope->lookup(target.names[0]);
    if (!ns || !ns->is_namespace()) {
      auto [line, column] = line_column(parsed_.source, offset);
      throw TemplateError("cannot assign attribute on non-namespace object", line, column);
    }
    ns->as_namespace().attributes.set(target.attribute, value);
    return;
  }
  if (!target.tuple) {
    scope->vars.set(target.names[0], value);
    return;
  }
  std::vector<Value> items = iterate(value);
  if (items.size() > target.names.size())
    throw TemplateError("too many values to unpack (expected " + std::to_string(target.names.size()) + ")");
  if (items.size() < target.names.size())
    throw TemplateError("not enough values to unpack (expected " + std::to_string(target.names.size()) + ", got " +
                        std::to_string(items.size()) + ")");
  for (std::size_t i = 0; i < items.size(); ++i) scope->vars.set(target.names[i], items[i]);
}

void Interpreter::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  Value iterable = eval(*s.expr, scope);
  std::vector<Value> items = iterate(iterable);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      count_iterations(1);
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(s.target, item, probe, s.offset);
      if (eval(*s.filter, probe).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.else_body, scope, out);
    return;
  }
  const auto n = static_cast<int64_t>(items.size());
  // loop.changed's memory; shared because a template may keep `loop` beyond this call.
  auto changed_state = std::make_shared<std::optional<Value>>();
  for (int64_t i = 0; i < n; ++i) {
    count_iterations(1);
    auto local = std::make_shared<Scope>();
    local->parent = scope;
    Dict loop;
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(n - i));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    loop.set("previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < n ? items[static_cast<std::size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("cycle", [i](const CallArgs& a) -> Value {
      if (a.positional.empty()) throw TemplateError("no items for cycling given");
      return a.positional[static_cast<std::size_t>(i) % a.positional.size()];
    }));
    loop.set("changed", Value::function("changed", [changed_state](const CallArgs& a) -> Value {
      Value now = Value::list(a.positional);
      if (*changed_state && equals(now, **changed_state)) return Value(false);
      *changed_state = now;
      return Value(true);
    }));
    local->vars.set("loop", Value::dict(std::move(loop)));
    assign(s.target, items[static_cast<std::size_t>(i)], local, s.offset);
    Flow f = exec(s.body, local, out);
    if (f == Flow::Break) break;
  }
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  if (v.is_list()) return v.as_list().items;
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& [k, item] : v.as_dict().entries) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    for (char32_t cp : text::decode(v.as_string())) {
      std::string c;
      text::append_utf8(c, cp);
      chars.emplace_back(std::move(c));
    }
    return chars;
  }
  if (v.is_undefined()) return {};
  throw TemplateError("'" + v.type_name() + "' object is not iterable");
}

Value Interpreter::getattr(const Value& object, const std::string& name) {
  if (object.is_undefined()) object.fail_undefined();
  if (!name.empty() && name[0] == '_') return unsafe(object, name);
  if (object.is_namespace()) {
    if (const Value* v = object.as_namespace().attributes.find(name)) return *v;
    return missing_attribute(object, name);
  }
  auto method = bound_method(*this, object, name);
  if (method) return *method;
  if (object.is_dict()) {
    if (const Value* v = object.as_dict().find(name)) return *v;
  }
  return missing_attribute(object, name);
}

Value Interpreter::getitem(const Value& object, const Value& key) {
  if (object.is_undefined()) object.fail_undefined();
  if (object.is_dict() && key.is_string()) {
    if (const Value* v = object.as_dict().find(key.as_string())) return *v;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t idx = as_index(key);
    if (object.is_list()) {
      const auto& items = object.as_list().items;
      auto n = static_cast<int64_t>(items.size());
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n) return items[static_cast<std::size_t>(idx)];
    } else {
      auto cps = text::decode(object.as_string());
      auto n = static_cast<int64_t>(cps.size());
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n) return Value(text::encode(cps, static_cast<std::size_t>(idx), static_cast<std::size_t>(idx) + 1));
    }
    return missing_element(object, key);
  }
  if (key.is_string()) {
    // Python's obj[str] failed: jinja2 falls back to the attribute of that name.
    if (!key.as_string().empty() && key.as_string()[0] == '_') return unsafe(object, key.as_string());
    if (!object.is_dict() && !object.is_namespace()) {
      auto method = bound_method(*this, object, key.as_string());
      if (method) return *method;
    } else if (object.is_dict()) {
      auto method = bound_method(*this, object, key.as_string());
      if (method) return *method;
    }
    return missing_attribute(object, key.as_string());
  }
  return missing_element(object, key);
}

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) callee.fail_undefined();
  if (!callee.is_callable()) throw TemplateError("'" + callee.type_name() + "' object is not callable");
  CallArgs with_interpreter = args;
  with_interpreter.interpreter = this;
  return callee.as_callable().call(with_interpreter);
}

CallArgs Interpreter::eval_args(const Expr& e, const ScopePtr& scope, std::size_t first) {
  CallArgs args;
  args.interpreter = this;
  for (std::size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
  for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, scope));
  return args;
}

Value Interpreter::run_filter_expr(const Expr& filter, const Value& input, const ScopePtr& scope) {
  // The chain is nested innermost-first; the innermost has a null input.
  Value in = filter.args[0] ? run_filter_expr(*filter.args[0], input, scope) : input;
  return apply_filter(filter.name, in, eval_args(filter, scope, 1));
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  CallArgs a = args;
  a.interpreter = this;
  return run_filter(*this, name, input, a);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, const CallArgs& args) {
  CallArgs a = args;
  a.interpreter = this;
  return run_test(*this, name, input, a);
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case Expr::Kind::Const:
      return e.constant;
    case Expr::Kind::Name: {
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined(string_repr(e.name) + " is undefined");
    }
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      std::vector<Value> items;
      for (const auto& a : e.args) items.push_back(eval(*a, scope));
      return Value::list(std::move(items), e.kind == Expr::Kind::Tuple);
    }
    case Expr::Kind::Dict: {
      Dict d;
      for (const auto& [k, v] : e.dict_items) {
        Value key = eval(*k, scope);
        if (!key.is_string()) throw TemplateError("only string keys are supported in dict literals");
        d.set(key.as_string(), eval(*v, scope));
      }
      return Value::dict(std::move(d));
    }
    case Expr::Kind::Getattr:
      return getattr(eval(*e.args[0], scope), e.name);
    case Expr::Kind::Getitem: {
      Value object = eval(*e.args[0], scope);
      const Expr& key = *e.args[1];
      if (key.kind == Expr::Kind::Slice) {
        Value parts[3];
        for (int i = 0; i < 3; ++i) parts[i] = key.args[i] ? eval(*key.args[i], scope) : Value(nullptr);
        if (object.is_undefined()) object.fail_undefined();
        if (object.is_list()) {
          const auto& items = object.as_list().items;
          std::vector<Value> out;
          for (auto i : slice_indices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2]))
            out.push_back(items[i]);
          return Value::list(std::move(out), object.as_list().tuple);
        }
        if (object.is_string()) {
          auto cps = text::decode(object.as_string());
          std::string out;
          for (auto i : slice_indices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2]))
            text::append_utf8(out, cps[i]);
          return Value(std::move(out));
        }
        return Value::undefined(string_repr(object_type_repr(object)) + " has no element slice");
      }
      return getitem(object, eval(key, scope));
    }
    case Expr::Kind::Slice:
      throw TemplateError("slice outside of a subscript");
    case Expr::Kind::Call: {
      Value callee = eval(*e.args[0], scope);
      return call(callee, eval_args(e, scope, 1));
    }
    case Expr::Kind::Filter:
      return apply_filter(e.name, eval(*e.args[0], scope), eval_args(e, scope, 1));
    case Expr::Kind::Test: {
      bool r = apply_test(e.name, eval(*e.args[0], scope), eval_args(e, scope, 1));
      return Value(e.negated ? !r : r);
    }
    case Expr::Kind::Not:
      return Value(!eval(*e.args[0], scope).truthy());
    case Expr::Kind::Neg:
    case Expr::Kind::Pos: {
      Value v = eval(*e.args[0], scope);
      if (v.is_undefined()) v.fail_undefined();
      bool neg = e.kind == Expr::Kind::Neg;
      if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
      if (v.is_int() || v.is_bool()) {
        int64_t i = as_index(v);
        return Value(neg ? int_neg(i) : i);
      }
      throw TemplateError(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + v.type_name() + "'");
    }
    case Expr::Kind::Binary:
      return eval_binary(e.name, eval(*e.args[0], scope), eval(*e.args[1], scope));
    case Expr::Kind::And: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Kind::Compare: {
      Value left = eval(*e.args[0], scope);
      for (std::size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], scope);
        if (!eval_compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::Conditional: {
      if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
  }
  return {};
}

bool Interpreter::eval_compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (a.is_undefined()) a.fail_undefined();
      if (!a.is_string())
        throw TemplateError("'in <string>' requires string as left operand, not " + a.type_name());
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_list()) {
      for (const auto& item : b.as_list().items)
        if (equals(item, a)) {
          found = true;
          break;
        }
    } else if (b.is_dict()) {
      found = a.is_string() && b.as_dict().find(a.as_string()) != nullptr;
    } else if (b.is_undefined()) {
      found = false;
    } else {
      throw TemplateError("argument of type '" + b.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  auto unorderable = [&]() {
    std::string sym = op;
    return TemplateError("'" + sym + "' not supported between instances of '" + a.type_name() + "' and '" +
                         b.type_name() + "'");
  };
  bool orderable = (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
                   (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple);
  if (!orderable) throw unorderable();
  if (op == "<") return less_than(a, b);
  if (op == ">") return less_than(b, a);
  if (op == "<=") return !less_than(b, a);
  if (op == ">=") return !less_than(a, b);
  throw TemplateError("unknown comparison " + op);
}

Value Interpreter::eval_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    check_size(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  auto unsupported = [&]() {
    return TemplateError("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value(int_add(as_index(a), as_index(b)));
    if (nums) return Value(a.to_double() + b.to_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_string()) throw TemplateError("can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
      auto items = a.as_list().items;
      for (const auto& item : b.as_list().items) items.push_back(item);
      count_iterations(0);
      return Value::list(std::move(items), a.as_list().tuple);
    }
    if (a.is_list() && !a.as_list().tuple)
      throw TemplateError("can only concatenate list (not \"" + b.type_name() + "\") to list");
    throw unsupported();
  }
  if (op == "-") {
    if (ints) return Value(int_sub(as_index(a), as_index(b)));
    if (nums) return Value(a.to_double() - b.to_double());
    throw unsupported();
  }
  if (op == "*") {
    if (ints) return Value(int_mul(as_index(a), as_index(b)));
    if (nums) return Value(a.to_double() * b.to_double());
    const Value* seq = nullptr;
    const Value* count = nullptr;
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
      seq = &a;
      count = &b;
    } else if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
      seq = &b;
      count = &a;
    }
    if (!seq) throw TemplateError("can't multiply sequence by non-int of type '" + (a.is_string() || a.is_list() ? b : a).type_name() + "'");
    int64_t n = std::max<int64_t>(0, as_index(*count));
    std::size_t total = 0;  // n copies; a wrapped product would pass the limits and then loop n times
    if (__builtin_mul_overflow(static_cast<std::size_t>(n), seq->is_string() ? seq->as_string().size() : seq->as_list().items.size(), &total))
      total = std::numeric_limits<std::size_t>::max();
    if (total == 0) n = 0;  // an empty sequence repeated: nothing to loop over, however large n is
    if (seq->is_string()) {
      check_size(total);
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += seq->as_string();
      return Value(std::move(s));
    }
    count_iterations(total);
    std::vector<Value> items;
    for (int64_t i = 0; i < n; ++i)
      for (const auto& item : seq->as_list().items) items.push_back(item);
    return Value::list(std::move(items), seq->as_list().tuple);
  }
  if (op == "/") {
    if (!nums) throw unsupported();
    if (b.to_double() == 0) throw TemplateError(ints ? "division by zero" : "float division by zero");
    return Value(a.to_double() / b.to_double());
  }
  if (op == "//") {
    if (!nums) throw unsupported();
    if (ints) {
      if (as_index(b) == 0) throw TemplateError("integer division or modulo by zero");
      return Value(floor_div(as_index(a), as_index(b)));
    }
    if (b.to_double() == 0) throw TemplateError("float floor division by zero");
    return Value(std::floor(a.to_double() / b.to_double()));
  }
  if (op == "%") {
    if (a.is_string()) return Value(printf_format(*this, a.as_string(), b));
    if (!nums) throw unsupported();
    if (ints) {
      int64_t d = as_index(b);
      if (d == 0) throw TemplateError("integer division or modulo by zero");
      if (d == -1) return Value(int64_t(0));  // INT64_MIN % -1 is undefined in C++; Python gives 0
      int64_t r = as_index(a) % d;
      if (r != 0 && ((r < 0) != (d < 0))) r += d;
      return Value(r);
    }
    double d = b.to_double();
    if (d == 0) throw TemplateError("float modulo");
    double r = std::fmod(a.to_double(), d);
    if (r != 0 && ((r < 0) != (d < 0))) r += d;
    return Value(r);
  }
  if (op == "**") {
    if (!nums) throw unsupported();
    if (ints && as_index(b) >= 0) {
      int64_t base = as_index(a), e = as_index(b), r = 1;
      if (base == 0 || base == 1) return Value(e == 0 ? int64_t(1) : base);
      if (base == -1) return Value(e % 2 ? int64_t(-1) : int64_t(1));
      for (int64_t i = 0; i < e; ++i)  // |base| >= 2 overflows within 63 steps
        if (__builtin_mul_overflow(r, base, &r)) throw TemplateError("integer power overflows 64 bits");
      return Value(r);
    }
    return Value(std::pow(a.to_double(), b.to_double()));
  }
  throw TemplateError("unknown operator " + op);
}

}  // namespace tierlm::tmpl
