// Lexer: template source -> tokens, applying jinja2's whitespace rules at lex time exactly as jinja2's lexer does
// (trim_blocks, lstrip_blocks, "-"/"+" markers, comments dropped, {% raw %} kept verbatim, one trailing newline of
// the source dropped). The parser never sees whitespace decisions.
#pragma once

#include <string>
#include <vector>

namespace tierlm::tmpl {

struct Token {
  enum class Kind { Data, VariableBegin, VariableEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, End };
  Kind kind;
  std::string text;  // data, name, decoded string literal, number spelling (underscores removed) or operator
  std::size_t offset = 0;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// `source` must already be newline-normalized (see normalize_newlines). Throws TemplateError.
std::vector<Token> lex(const std::string& source, const LexOptions& options = {});

// jinja2 turns \r\n and \r into \n and drops one trailing newline (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& source);

}  // namespace tierlm::tmpl
