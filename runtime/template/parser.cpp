// Recursive-descent parser following jinja2's grammar and operator precedence (parser.py): condexpr < or < and <
// not < compare < + - < ~ < * / // % < ** < unary - + < primary with postfix (. [] ()) and filters/tests.
#include <charconv>
#include <set>

#include "runtime/template/ast.h"
#include "runtime/template/lexer.h"
#include "runtime/template/template_error.h"

namespace tierlm::tmpl {

std::pair<int, int> line_column(const std::string& source, std::size_t offset) {
  int line = 1, column = 1;
  for (std::size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xc0) != 0x80) {
      ++column;
    }
  }
  return {line, column};
}

namespace {

using K = Token::Kind;

class Parser {
 public:
  Parser(const std::string& source, std::vector<Token> tokens, const ParseLimits& limits)
      : source_(source), tokens_(std::move(tokens)), limits_(limits) {}

  Body parse_all() {
    std::string which;
    return parse_body({}, &which);
  }

 private:
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_depth) p.fail("template nests too deeply (limit " + std::to_string(p.limits_.max_depth) + ")");
    }
    ~DepthGuard() { --p.depth_; }
  };

  [[noreturn]] void fail(const std::string& message) const { fail_at(current().offset, message); }
  [[noreturn]] void fail_at(std::size_t offset, const std::string& message) const {
    auto [line, column] = line_column(source_, offset);
    throw TemplateError(message, line, column);
  }

  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(std::size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  Token next() {
    Token t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op) const { return current().kind == K::Operator && current().text == op; }
  bool is_name(const char* name) const { return current().kind == K::Name && current().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case K::Data: return "template data";
      case K::VariableBegin: return "begin of print statement";
      case K::VariableEnd: return "end of print statement";
      case K::BlockBegin: return "begin of statement block";
      case K::BlockEnd: return "end of statement block";
      case K::End: return "end of template";
      case K::String: return "string";
      case K::Integer: return "integer";
      case K::Float: return "float";
      default: return t.text;
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected token '") + op + "', got '" + describe(current()) + "'");
  }
  std::string expect_name() {
    if (current().kind != K::Name) fail("expected name, got '" + describe(current()) + "'");
    return next().text;
  }
  void expect_block_end() {
    if (current().kind != K::BlockEnd) fail("expected end of statement block, got '" + describe(current()) + "'");
    next();
  }

  ExprPtr make(Expr::Kind kind, std::size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }
  StmtPtr make_stmt(Stmt::Kind kind, std::size_t offset) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->offset = offset;
    return s;
  }

  // ---- statements ----

  // Parses until a block whose first name is in `ends`; leaves the stream after that name and reports it.
  Body parse_body(const std::set<std::string>& ends, std::string* which, const char* opener = nullptr) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = current();
      if (t.kind == K::Data) {
        auto s = make_stmt(Stmt::Kind::Text, t.offset);
        s->text = t.text;
        next();
        body.push_back(std::move(s));
      } else if (t.kind == K::VariableBegin) {
        next();
        auto s = make_stmt(Stmt::Kind::Print, t.offset);
        s->expr = parse_tuple(true, false);
        if (current().kind != K::VariableEnd) fail("unexpected '" + describe(current()) + "'");
        next();
        body.push_back(std::move(s));
      } else if (t.kind == K::BlockBegin) {
        next();
        if (current().kind == K::Name && ends.count(current().text)) {
          *which = next().text;
          return body;
        }
        body.push_back(parse_statement());
      } else if (t.kind == K::End) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          fail(std::string("Unexpected end of template. Jinja was looking for the following tags: ") + list +
               (opener ? std::string(". The innermost block that needs to be closed is '") + opener + "'." : "."));
        }
        return body;
      } else {
        fail("unexpected '" + describe(t) + "'");
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& t = current();
    if (t.kind != K::Name) fail("tag name expected");
    const std::string& name = t.text;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "generation") {
      auto s = make_stmt(Stmt::Kind::Scope, next().offset);
      expect_block_end();
      std::string which;
      s->body = parse_body({"endgeneration"}, &which, "generation");
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop");
      auto s = make_stmt(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, next().offset);
      expect_block_end();
      return s;
    }
    static const std::set<std::string> unsupported = {"include", "import", "from", "extends", "block", "autoescape", "do", "trans"};
    if (unsupported.count(name)) fail("unsupported tag '" + name + "' (chat templates may not load other templates or use extensions)");
    fail("Encountered unknown tag '" + name + "'.");
  }

  StmtPtr parse_if() {
    auto s = make_stmt(Stmt::Kind::If, next().offset);
    while (true) {
      ExprPtr cond = parse_tuple(false, false);
      expect_block_end();
      std::string which;
      Body body = parse_body({"elif", "else", "endif"}, &which, "if");
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (which == "elif") continue;
      if (which == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &which, "if");
      }
      expect_block_end();
      return s;
    }
  }

  Target parse_target(bool allow_attribute) {
    Target target;
    bool paren = skip_op("(");
    target.names.push_back(expect_name());
    if (allow_attribute && !paren && is_op(".")) {
      next();
      target.attribute = expect_name();
      return target;
    }
    while (skip_op(",")) {
      target.tuple = true;
      if (current().kind != K::Name) break;
      target.names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return target;
  }

  StmtPtr parse_for() {
    auto s = make_stmt(Stmt::Kind::For, next().offset);
    s->target = parse_target(false);
    if (!skip_name("in")) fail("expected 'in' in for loop");
    s->expr = parse_tuple(false, false);
    if (skip_name("if")) s->filter = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    std::string which;
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"}, &which, "for");
    --loop_depth_;
    if (which == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &which, "for");
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    auto s = make_stmt(Stmt::Kind::Set, next().offset);
    s->target = parse_target(true);
    if (skip_op("=")) {
      s->expr = parse_tuple(true, false);
      expect_block_end();
      return s;
    }
    s->kind = Stmt::Kind::SetBlock;
    if (is_op("|")) s->filter = parse_filter_chain(nullptr);
    expect_block_end();
    std::string which;
    s->body = parse_body({"endset"}, &which, "set");
    expect_block_end();
    return s;
  }

  void parse_params(std::vector<MacroParam>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(Stmt::Kind::Macro, next().offset);
    s->name = expect_name();
    parse_params(s->params);
    expect_block_end();
    std::string which;
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"}, &which, "macro");
    loop_depth_ = saved;
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = make_stmt(Stmt::Kind::CallBlock, next().offset);
    if (is_op("(")) parse_params(s->params);
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) fail_at(s->offset, "expected call");
    expect_block_end();
    std::string which;
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endcall"}, &which, "call");
    loop_depth_ = saved;
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(Stmt::Kind::FilterBlock, next().offset);
    s->filter = parse_filter_chain(nullptr, false);
    expect_block_end();
    std::string which;
    s->body = parse_body({"endfilter"}, &which, "filter");
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(Stmt::Kind::With, next().offset);
    while (current().kind != K::BlockEnd) {
      if (!s->assignments.empty()) expect_op(",");
      Target t = parse_target(false);
      expect_op("=");
      s->assignments.emplace_back(std::move(t), parse_expression(true));
    }
    expect_block_end();
    std::string which;
    s->body = parse_body({"endwith"}, &which, "with");
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  // A comma-separated list becomes a tuple (jinja's parse_tuple); a single expression stays as is.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens) {
    std::size_t offset = current().offset;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (current().kind == K::VariableEnd || current().kind == K::BlockEnd || is_op(")")) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        saw_comma = true;
      else
        break;
    }
    if (!saw_comma) {
      if (items.empty()) {
        if (explicit_parens) return make(Expr::Kind::Tuple, offset);
        fail("Expected an expression, got '" + describe(current()) + "'");
      }
      return std::move(items[0]);
    }
    auto e = make(Expr::Kind::Tuple, offset);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    if (!with_condexpr) return parse_or();
    std::size_t offset = current().offset;
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      auto e = make(Expr::Kind::Conditional, offset);
      ExprPtr cond = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression(true) : nullptr;
      e->args.push_back(std::move(expr));
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(otherwise));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(Expr::Kind kind, std::size_t offset, ExprPtr a, ExprPtr b, std::string name = {}) {
    auto e = make(kind, offset);
    e->name = std::move(name);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    std::size_t offset = current().offset;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary(Expr::Kind::Or, offset, std::move(left), parse_and());
    return left;
  }

  ExprPtr parse_and() {
    std::size_t offset = current().offset;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary(Expr::Kind::And, offset, std::move(left), parse_not());
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::Not, next().offset);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    std::size_t offset = current().offset;
    ExprPtr expr = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      const Token& t = current();
      if (t.kind == K::Operator && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                    t.text == "<=" || t.text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == K::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, offset);
        cmp->args.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_math1() {
    std::size_t offset = current().offset;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      left = binary(Expr::Kind::Binary, offset, std::move(left), parse_concat(), op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    std::size_t offset = current().offset;
    ExprPtr left = parse_math2();
    while (skip_op("~")) left = binary(Expr::Kind::Binary, offset, std::move(left), parse_math2(), "~");
    return left;
  }

  ExprPtr parse_math2() {
    std::size_t offset = current().offset;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      left = binary(Expr::Kind::Binary, offset, std::move(left), parse_pow(), op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    std::size_t offset = current().offset;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary(Expr::Kind::Binary, offset, std::move(left), parse_unary(true), "**");
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    std::size_t offset = current().offset;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      bool neg = next().text == "-";
      node = make(neg ? Expr::Kind::Neg : Expr::Kind::Pos, offset);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    std::size_t offset = t.offset;
    if (t.kind == K::Name) {
      std::string name = next().text;
      auto e = make(Expr::Kind::Const, offset);
      if (name == "true" || name == "True") e->constant = Value(true);
      else if (name == "false" || name == "False") e->constant = Value(false);
      else if (name == "none" || name == "None") e->constant = Value(nullptr);
      else {
        e->kind = Expr::Kind::Name;
        e->name = name;
      }
      return e;
    }
    if (t.kind == K::String) {
      std::string s = next().text;
      while (current().kind == K::String) s += next().text;  // adjacent literals concatenate
      auto e = make(Expr::Kind::Const, offset);
      e->constant = Value(std::move(s));
      return e;
    }
    if (t.kind == K::Integer || t.kind == K::Float) {
      std::string spelled = next().text;
      auto e = make(Expr::Kind::Const, offset);
      if (t.kind == K::Integer) {
        int64_t v = 0;
        auto r = std::from_chars(spelled.data(), spelled.data() + spelled.size(), v);
        if (r.ec != std::errc()) fail_at(offset, "integer literal out of range");
        e->constant = Value(v);
      } else {
        e->constant = Value(std::strtod(spelled.c_str(), nullptr));
      }
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      auto e = make(Expr::Kind::List, next().offset);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      auto e = make(Expr::Kind::Dict, next().offset);
      while (!is_op("}")) {
        if (!e->dict_items.empty()) expect_op(",");
        if (is_op("}")) break;
        ExprPtr key = parse_expression(true);
        expect_op(":");
        e->dict_items.emplace_back(std::move(key), parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail("unexpected '" + describe(t) + "'");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(*this);
    Token t = next();
    if (t.text == ".") {
      if (current().kind == K::Name) {
        auto e = make(Expr::Kind::Getattr, t.offset);
        e->name = next().text;
        e->args.push_back(std::move(node));
        return e;
      }
      if (current().kind == K::Integer) {
        auto e = make(Expr::Kind::Getitem, t.offset);
        auto idx = make(Expr::Kind::Const, current().offset);
        int64_t v = 0;
        std::from_chars(current().text.data(), current().text.data() + current().text.size(), v);
        idx->constant = Value(v);
        next();
        e->args.push_back(std::move(node));
        e->args.push_back(std::move(idx));
        return e;
      }
      fail("expected name or number");
    }
    // "[" subscript: an index or a slice
    auto e = make(Expr::Kind::Getitem, t.offset);
    e->args.push_back(std::move(node));
    ExprPtr parts[3];
    bool slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++part > 2) fail("invalid slice");
        continue;
      }
      if (parts[part]) fail("expected ':' or ']'");
      parts[part] = parse_expression(true);
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) fail("expected subscript expression");
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto s = make(Expr::Kind::Slice, t.offset);
    for (auto& p : parts) s->args.push_back(std::move(p));
    e->args.push_back(std::move(s));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (current().kind == K::Name && peek().kind == K::Operator && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard guard(*this);
    auto e = make(Expr::Kind::Call, current().offset);
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().kind == K::Name) {
      next();
      name += "." + next().text;
    }
    return name;
  }

  // One or more "| name(args)"; `node` null means the input comes from a block body.
  ExprPtr parse_filter_chain(ExprPtr node, bool expect_pipe_first = true) {
    bool first = true;
    while (true) {
      if (first && !expect_pipe_first) {
        // filter block: the first filter has no pipe
      } else if (!skip_op("|")) {
        break;
      }
      first = false;
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::Filter, current().offset);
      e->name = dotted_name();
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard guard(*this);
    auto e = make(Expr::Kind::Test, next().offset);
    if (skip_name("not")) e->negated = true;
    e->name = dotted_name();
    e->args.push_back(std::move(node));
    const Token& t = current();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.kind == K::Name || t.kind == K::String || t.kind == K::Integer || t.kind == K::Float ||
                is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      ExprPtr arg = parse_primary();
      e->args.push_back(parse_postfix(std::move(arg)));
    }
    return e;
  }

  const std::string& source_;
  std::vector<Token> tokens_;
  ParseLimits limits_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::shared_ptr<const ParsedTemplate> parse_template(std::string source, const ParseLimits& limits) {
  if (source.size() > limits.max_source_bytes)
    throw TemplateError("template is larger than " + std::to_string(limits.max_source_bytes) + " bytes");
  auto parsed = std::make_shared<ParsedTemplate>();
  parsed->source = normalize_newlines(source);
  auto tokens = lex(parsed->source);
  Parser parser(parsed->source, std::move(tokens), limits);
  parsed->body = parser.parse_all();
  return parsed;
}

}  // namespace tierlm::tmpl
