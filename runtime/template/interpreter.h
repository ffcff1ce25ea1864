// Interpreter: walks a ParsedTemplate with jinja2's runtime semantics under transformers' sandbox (immutable
// containers, no underscore attributes) and hard limits (output bytes, loop iterations, macro depth) so that a
// hostile template ends in a TemplateError instead of hanging or exhausting memory. One instance per render.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/template/ast.h"
#include "runtime/template/value.h"

namespace tierlm::tmpl {

struct RenderLimits {
  std::size_t max_output_bytes = 4u << 20;      // any rendered text or built string
  std::size_t max_loop_iterations = 100000;     // summed over all loops (and range() sizes)
  int max_call_depth = 64;                      // nested macro / caller() calls
};

struct Scope {
  std::shared_ptr<Scope> parent;
  Dict vars;
  const Value* lookup(std::string_view name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  Interpreter(const ParsedTemplate& parsed, const RenderLimits& limits) : parsed_(parsed), limits_(limits) {}
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  ~Interpreter();

  // `context` holds the template's variables (messages, tools, ...); jinja2's globals sit beneath it.
  std::string render(const Dict& context);

  // Helpers shared with the built-in filters, tests and methods.
  Value getattr(const Value& object, const std::string& name);
  Value getitem(const Value& object, const Value& key);
  Value call(const Value& callee, const CallArgs& args);
  std::vector<Value> iterate(const Value& v);  // Python iteration (dict -> keys, str -> chars)
  void check_size(std::size_t bytes) const;
  void count_iterations(std::size_t n);
  // namespace() objects made during this render. A template can store a namespace inside itself
  // ({% set ns.me = ns %}), a shared_ptr cycle; the destructor clears every one, so none outlives its render.
  void own(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }
  Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, const CallArgs& args);

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void assign(const Target& target, const Value& value, const ScopePtr& scope, std::size_t offset);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_binary(const std::string& op, const Value& a, const Value& b);
  bool eval_compare(const std::string& op, const Value& a, const Value& b);
  CallArgs eval_args(const Expr& e, const ScopePtr& scope, std::size_t first);
  Value make_macro(const Stmt& stmt, const ScopePtr& scope);
  Value run_filter_expr(const Expr& filter, const Value& input, const ScopePtr& scope);
  void append(std::string& out, std::string_view text) const;
  [[noreturn]] void rethrow_at(const TemplateError& e, std::size_t offset) const;

  const ParsedTemplate& parsed_;
  RenderLimits limits_;
  std::size_t iterations_ = 0;
  int call_depth_ = 0;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
};

// Whether a filter / test of this name exists (checked at parse time, as jinja2 does at compile time).
bool has_filter(std::string_view name);
bool has_test(std::string_view name);

}  // namespace tierlm::tmpl
