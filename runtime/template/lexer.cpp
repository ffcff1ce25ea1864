#include "runtime/template/lexer.h"

#include <cstring>

#include "runtime/template/ast.h"
#include "runtime/template/template_error.h"
#include "runtime/template/text.h"

namespace tierlm::tmpl {

std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

[[noreturn]] void fail(const std::string& source, std::size_t offset, const std::string& message) {
  auto [line, column] = line_column(source, offset);
  throw TemplateError(message, line, column);
}

// Length in bytes of the Unicode whitespace run starting at `pos`.
std::size_t whitespace_run(const std::string& s, std::size_t pos) {
  std::size_t p = pos;
  while (p < s.size()) {
    auto c = static_cast<unsigned char>(s[p]);
    if (c < 0x80) {
      if (!text::is_space(c)) break;
      ++p;
      continue;
    }
    std::size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : 4;
    auto cps = text::decode(std::string_view(s).substr(p, len));
    if (cps.empty() || !text::is_space(cps[0])) break;
    p += len;
  }
  return p - pos;
}

bool only_spaces(const std::string& s, std::size_t from) {
  if (from >= s.size()) return false;  // jinja's \s+ needs at least one character
  for (char32_t cp : text::decode(std::string_view(s).substr(from)))
    if (!text::is_space(cp) || cp == '\n') return false;
  return true;
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Python's "unicode-escape" decoding of a string literal body, as jinja2 applies it.
std::string unescape(const std::string& source, std::size_t offset, std::string_view body) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    auto hex = [&](std::size_t n) -> char32_t {
      char32_t v = 0;
      for (std::size_t k = 1; k <= n; ++k) {
        if (i + k >= body.size()) fail(source, offset, "truncated escape in string");
        char h = body[i + k];
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0) fail(source, offset, "invalid escape in string");
        v = v * 16 + static_cast<char32_t>(d);
      }
      i += n;
      return v;
    };
    switch (e) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': text::append_utf8(out, hex(2)); break;
      case 'u': text::append_utf8(out, hex(4)); break;
      case 'U': {
        char32_t cp = hex(8);
        if (cp > 0x10ffff) fail(source, offset, "invalid \\U escape in string");
        text::append_utf8(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + static_cast<char32_t>(body[++i] - '0');
          text::append_utf8(out, v);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& s, const LexOptions& o) : s_(s), o_(o) {}

  std::vector<Token> run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      std::size_t start = find_tag(pos);
      if (start == std::string::npos) {
        push(Token::Kind::Data, s_.substr(pos), pos);
        break;
      }
      char kind = s_[start + 1];  // '{', '%' or '#'
      char sign = start + 2 < s_.size() ? s_[start + 2] : '\0';
      std::string data = s_.substr(pos, start - pos);
      if (sign == '-') {
        data = text::strip(data, false, true);
      } else if (sign != '+' && o_.lstrip_blocks && kind != '{') {
        std::size_t l_pos = data.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && only_spaces(data, l_pos)) data.resize(l_pos);
      }
      if (!data.empty()) push(Token::Kind::Data, data, pos);
      std::size_t inner = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        pos = comment(start, inner);
      } else if (kind == '%' && is_raw(inner)) {
        pos = raw(start, inner);
      } else {
        pos = tag(start, inner, kind == '%');
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    push(Token::Kind::End, "", s_.size());
    return std::move(tokens_);
  }

 private:
  void push(Token::Kind kind, std::string text, std::size_t offset) {
    tokens_.push_back(Token{kind, std::move(text), offset});
  }

  std::size_t find_tag(std::size_t pos) const {
    while (true) {
      std::size_t p = s_.find('{', pos);
      if (p == std::string::npos || p + 1 >= s_.size()) return std::string::npos;
      char n = s_[p + 1];
      if (n == '{' || n == '%' || n == '#') return p;
      pos = p + 1;
    }
  }

  // After a closing tag at `after` (just past "%}"/"}}"/"#}"): the "-" marker eats following whitespace, a block or
  // comment end eats one newline under trim_blocks unless marked "+".
  std::size_t after_end(std::size_t after, char marker, bool trims) const {
    if (marker == '-') return after + whitespace_run(s_, after);
    if (marker != '+' && trims && o_.trim_blocks && after < s_.size() && s_[after] == '\n') return after + 1;
    return after;
  }

  std::size_t comment(std::size_t start, std::size_t inner) {
    std::size_t end = s_.find("#}", inner);
    if (end == std::string::npos) fail(s_, start, "missing end of comment tag");
    char marker = end > inner && (s_[end - 1] == '-' || s_[end - 1] == '+') ? s_[end - 1] : '\0';
    return after_end(end + 2, marker, true);
  }

  bool is_raw(std::size_t inner) const {
    std::size_t p = inner;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n')) ++p;
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0 || s_.compare(p, 3, "+%}") == 0;
  }

  std::size_t raw(std::size_t start, std::size_t inner) {
    std::size_t close = s_.find("%}", inner);
    char marker = s_[close - 1] == '-' ? '-' : '\0';
    std::size_t body_start = after_end(close + 2, marker, false);
    // Find {% endraw %} with optional markers and spaces.
    std::size_t search = body_start;
    while (true) {
      std::size_t p = s_.find("{%", search);
      if (p == std::string::npos) fail(s_, start, "missing end of raw directive");
      std::size_t q = p + 2;
      char sign = q < s_.size() ? s_[q] : '\0';
      if (sign == '-' || sign == '+') ++q;
      while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t' || s_[q] == '\n')) ++q;
      if (s_.compare(q, 6, "endraw") == 0) {
        q += 6;
        while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t' || s_[q] == '\n')) ++q;
        char end_marker = '\0';
        if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) end_marker = s_[q++];
        if (s_.compare(q, 2, "%}") == 0) {
          std::string body = s_.substr(body_start, p - body_start);
          if (sign == '-') body = text::strip(body, false, true);
          else if (sign != '+' && o_.lstrip_blocks) {
            std::size_t l_pos = body.rfind('\n');
            l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
            if (l_pos > 0 && only_spaces(body, l_pos)) body.resize(l_pos);
          }
          if (!body.empty()) push(Token::Kind::Data, body, body_start);
          return after_end(q + 2, end_marker, true);
        }
      }
      search = p + 2;
    }
  }

  std::size_t tag(std::size_t start, std::size_t pos, bool block) {
    push(block ? Token::Kind::BlockBegin : Token::Kind::VariableBegin, "", start);
    const char* end = block ? "%}" : "}}";
    int balance = 0;
    while (true) {
      while (pos < s_.size() && (s_[pos] == ' ' || s_[pos] == '\t' || s_[pos] == '\n' || s_[pos] == '\v' || s_[pos] == '\f')) ++pos;
      if (pos >= s_.size()) fail(s_, start, block ? "unexpected end of template, missing '%}'" : "unexpected end of template, missing '}}'");
      if (balance == 0) {
        char marker = '\0';
        std::size_t p = pos;
        if (s_[p] == '-' || (block && s_[p] == '+')) marker = s_[p++];
        if (s_.compare(p, 2, end) == 0) {
          push(block ? Token::Kind::BlockEnd : Token::Kind::VariableEnd, "", pos);
          return after_end(p + 2, marker, block);
        }
      }
      char c = s_[pos];
      if (c == '\'' || c == '"') {
        std::size_t p = pos + 1;
        while (p < s_.size() && s_[p] != c) p += (s_[p] == '\\') ? 2 : 1;
        if (p >= s_.size()) fail(s_, pos, "unexpected end of string");
        push(Token::Kind::String, unescape(s_, pos, std::string_view(s_).substr(pos + 1, p - pos - 1)), pos);
        pos = p + 1;
      } else if (is_digit(c)) {
        pos = number(pos);
      } else if (is_name_start(c)) {
        std::size_t p = pos;
        while (p < s_.size() && is_name_char(s_[p])) ++p;
        push(Token::Kind::Name, s_.substr(pos, p - pos), pos);
        pos = p;
      } else {
        static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (s_.compare(pos, 2, t) == 0) op = t;
        if (op.empty()) {
          if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == '\0')
            fail(s_, pos, std::string("unexpected char '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++balance;
        if (op == ")" || op == "]" || op == "}") {
          if (balance == 0) fail(s_, pos, "unexpected '" + op + "'");
          --balance;
        }
        push(Token::Kind::Operator, op, pos);
        pos += op.size();
      }
    }
  }

  std::size_t digits(std::size_t p, std::string& out) const {
    // \d+(_\d+)*
    while (p < s_.size()) {
      if (is_digit(s_[p])) {
        out.push_back(s_[p++]);
      } else if (s_[p] == '_' && p + 1 < s_.size() && is_digit(s_[p + 1]) && !out.empty()) {
        ++p;
      } else {
        break;
      }
    }
    return p;
  }

  std::size_t number(std::size_t pos) {
    std::string spelled;
    std::size_t p = digits(pos, spelled);
    bool after_dot = pos > 0 && s_[pos - 1] == '.';
    bool is_float = false;
    if (!after_dot) {
      std::string frac;
      std::size_t q = p;
      if (q + 1 < s_.size() && s_[q] == '.' && is_digit(s_[q + 1])) {
        std::string f;
        q = digits(q + 1, f);
        frac = "." + f;
      }
      std::size_t r = q;
      std::string exp;
      if (r < s_.size() && (s_[r] == 'e' || s_[r] == 'E')) {
        std::size_t t = r + 1;
        std::string sign;
        if (t < s_.size() && (s_[t] == '+' || s_[t] == '-')) sign = s_[t++];
        if (t < s_.size() && is_digit(s_[t])) {
          std::string e;
          t = digits(t, e);
          exp = "e" + sign + e;
          r = t;
        }
      }
      if (!frac.empty() || !exp.empty()) {
        is_float = true;
        spelled += frac + exp;
        p = exp.empty() ? q : r;
      }
    }
    push(is_float ? Token::Kind::Float : Token::Kind::Integer, spelled, pos);
    return p;
  }

  const std::string& s_;
  LexOptions o_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const LexOptions& options) { return Lexer(source, options).run(); }

}  // namespace tierlm::tmpl
