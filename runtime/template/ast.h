// The parsed form of a chat template: expressions and statements as jinja2's parser builds them, with the source
// offset of each node so render-time errors can point at a line. Produced by parse_template, walked by Interpreter.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/template/value.h"

namespace tierlm::tmpl {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    Const,       // constant
    Name,        // name
    List,        // args
    Tuple,       // args
    Dict,        // kwargs-like pairs in dict_items (key expr, value expr)
    Getattr,     // args[0] . name
    Getitem,     // args[0] [ args[1] ]
    Slice,       // args[0..2]: start, stop, step (null = absent)
    Call,        // args[0](args[1..], kwargs)
    Filter,      // args[0] | name(args[1..], kwargs); args[0] null in a filter block
    Test,        // args[0] is [not] name(args[1..])
    Not,         // not args[0]
    Neg,         // -args[0]
    Pos,         // +args[0]
    Binary,      // args[0] name args[1]  (+ - * / // % ** ~)
    And,         // args[0] and args[1]
    Or,          // args[0] or args[1]
    Compare,     // args[0] ops[0] args[1] ops[1] args[2] ...
    Conditional, // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  std::size_t offset = 0;
  Value constant;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> dict_items;
  std::vector<std::string> ops;
};

// Assignment target: a name, a tuple of names (unpacking), or namespace.attribute.
struct Target {
  std::vector<std::string> names;  // one name, or several for unpacking
  bool tuple = false;
  std::string attribute;           // non-empty: names[0].attribute = value
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    Text,      // text
    Print,     // expr
    If,        // branches (cond, body), else_body
    For,       // target, expr (iterable), filter (may be null), body, else_body
    Set,       // target, expr
    SetBlock,  // target, body, filter (may be null; a Filter chain whose innermost input is null)
    Macro,     // name, params, body
    CallBlock, // expr (a Call), params (caller's), body
    FilterBlock,  // filter, body
    With,      // assignments (target, expr), body
    Break,
    Continue,
    Scope,     // body rendered as is (transformers' {% generation %} block)
  };
  Kind kind;
  std::size_t offset = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr filter;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
  std::vector<std::pair<Target, ExprPtr>> assignments;
};

struct ParsedTemplate {
  std::string source;  // newline-normalized, for line numbers
  Body body;
};

struct ParseLimits {
  int max_depth = 128;                 // nesting of blocks and expressions
  std::size_t max_source_bytes = 1 << 20;
};

// Throws TemplateError with line/column on any syntax error or unsupported construct.
std::shared_ptr<const ParsedTemplate> parse_template(std::string source, const ParseLimits& limits = {});

// 1-based line and column of a byte offset of the normalized source.
std::pair<int, int> line_column(const std::string& source, std::size_t offset);

}  // namespace tierlm::tmpl
