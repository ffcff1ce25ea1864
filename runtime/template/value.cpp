#include "runtime/template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <unicode/uchar.h>

#include "runtime/template/template_error.h"
#include "runtime/template/text.h"

namespace tierlm::tmpl {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

std::optional<Value> CallArgs::take(std::size_t index, std::string_view name) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  return std::nullopt;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<List>();
  l->items = std::move(items);
  l->tuple = tuple;
  return Value(std::move(l));
}

Value Value::dict(Dict d) { return Value(std::make_shared<Dict>(std::move(d))); }

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

double Value::to_double() const {
  if (is_float()) return as_float();
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  throw TemplateError("not a number");
}

void Value::fail_undefined() const {
  const auto& u = as_undefined();
  throw TemplateError(u.message.empty() ? "value is undefined" : u.message);
}

bool Value::truthy() const {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, std::nullptr_t>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<List>>) return !x->items.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Dict>>) return !x->entries.empty();
        else return true;
      },
      v_);
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return as_list().tuple ? "tuple" : "list";
  if (is_dict()) return "dict";
  if (is_namespace()) return "Namespace";
  return "function";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci is like "-1.2345e-05": split into sign, digits and exponent.
  std::string sign;
  std::size_t pos = 0;
  if (sci[0] == '-') {
    sign = "-";
    pos = 1;
  }
  auto epos = sci.find('e');
  std::string mantissa = sci.substr(pos, epos - pos);
  int exponent = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  int decpt = exponent + 1;  // digits d1d2... represent 0.d1d2... * 10^decpt
  if (decpt > -4 && decpt <= 16) {
    std::string out = sign;
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
    } else if (static_cast<std::size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<std::size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." + digits.substr(static_cast<std::size_t>(decpt));
    }
    return out;
  }
  std::string out = sign + digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[32];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + ebuf;
}

std::string string_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : text::decode(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp < 0x7f) {
      out.push_back(static_cast<char>(cp));
    } else {
      int8_t type = u_charType(static_cast<UChar32>(cp));
      bool printable = !(type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_SURROGATE ||
                         type == U_PRIVATE_USE_CHAR || type == U_UNASSIGNED || type == U_LINE_SEPARATOR ||
                         type == U_PARAGRAPH_SEPARATOR || (type == U_SPACE_SEPARATOR));
      if (printable) {
        text::append_utf8(out, cp);
      } else {
        char buf[16];
        if (cp < 0x100)
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
        else if (cp < 0x10000)
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        else
          std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
        out += buf;
      }
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

// A namespace can hold itself (through a list too), and nested shared lists grow their text exponentially
// ({% set a = [a, a] %} thirty times): printing stops at these bounds with a TemplateError, never a stack overflow
// or gigabytes of text. The render's own output limit applies to whatever is printed after that.
constexpr int kMaxReprDepth = 100;
constexpr std::size_t kMaxReprBytes = 16u << 20;

void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > kMaxReprDepth)
    throw TemplateError("value nested more than " + std::to_string(kMaxReprDepth) +
                        " levels deep (does a namespace or list contain itself?)");
  if (out.size() > kMaxReprBytes)
    throw TemplateError("value's text exceeds " + std::to_string(kMaxReprBytes) + " bytes");
  if (v.is_string()) {
    out += string_repr(v.as_string());
  } else if (v.is_list()) {
    const auto& l = v.as_list();
    out += l.tuple ? "(" : "[";
    for (std::size_t i = 0; i < l.items.size(); ++i) {
      if (i) out += ", ";
      repr_into(out, l.items[i], depth + 1);
    }
    if (l.tuple && l.items.size() == 1) out += ",";
    out += l.tuple ? ")" : "]";
  } else if (v.is_dict() || v.is_namespace()) {
    const Dict& d = v.is_dict() ? v.as_dict() : v.as_namespace().attributes;
    out += v.is_dict() ? "{" : "<Namespace {";
    bool first = true;
    for (const auto& [k, item] : d.entries) {
      if (!first) out += ", ";
      first = false;
      out += string_repr(k) + ": ";
      repr_into(out, item, depth + 1);
    }
    out += v.is_dict() ? "}" : "}>";
  } else if (v.is_undefined()) {
    out += "Undefined";
  } else {
    out += to_str(v);
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_callable()) return "<function " + v.as_callable().name + ">";
  return to_repr(v);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    auto ai = a.is_bool() ? int64_t(a.as_bool()) : a.as_int();
    auto bi = b.is_bool() ? int64_t(b.as_bool()) : b.as_int();
    return ai == bi;
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (std::size_t i = 0; i < x.items.size(); ++i)
      if (!equals(x.items[i], y.items[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const auto& x = a.as_dict();
    const auto& y = b.as_dict();
    if (x.entries.size() != y.entries.size()) return false;
    for (const auto& [k, v] : x.entries) {
      const Value* other = y.find(k);
      if (!other || !equals(v, *other)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  if (a.is_callable() && b.is_callable()) return &a.as_callable() == &b.as_callable();
  return false;
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    auto ai = a.is_bool() ? int64_t(a.as_bool()) : a.as_int();
    auto bi = b.is_bool() ? int64_t(b.as_bool()) : b.as_int();
    return ai < bi;
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order == code point order
  if (a.is_list() && b.is_list() && a.as_list().tuple == b.as_list().tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto escape_cp = [&](unsigned cp) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    out += buf;
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20)
            escape_cp(c);
          else
            out.push_back(ch);
      }
    }
  } else {
    for (char32_t cp : text::decode(s)) {
      switch (cp) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (cp < 0x20 || cp > 0x7e) {
            if (cp >= 0x10000) {
              char32_t v = cp - 0x10000;
              escape_cp(0xd800 | static_cast<unsigned>(v >> 10));
              escape_cp(0xdc00 | static_cast<unsigned>(v & 0x3ff));
            } else {
              escape_cp(static_cast<unsigned>(cp));
            }
          } else {
            out.push_back(static_cast<char>(cp));
          }
      }
    }
  }
  out.push_back('"');
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int level, int depth) {
  if (depth > 512) throw TemplateError("tojson: nesting too deep");
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += *o.indent;
  };
  if (v.is_string()) {
    json_string(out, v.as_string(), o.ensure_ascii);
  } else if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    double d = v.as_float();
    if (std::isnan(d))
      out += "NaN";
    else if (std::isinf(d))
      out += d > 0 ? "Infinity" : "-Infinity";
    else
      out += float_repr(d);
  } else if (v.is_list()) {
    const auto& items = v.as_list().items;
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i) out += o.item_separator;
      if (o.indent) newline(level + 1);
      json_value(out, items[i], o, level + 1, depth + 1);
    }
    if (o.indent) newline(level);
    out.push_back(']');
  } else if (v.is_dict()) {
    auto entries = v.as_dict().entries;
    if (entries.empty()) {
      out += "{}";
      return;
    }
    if (o.sort_keys)
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back('{');
    bool first = true;
    for (const auto& [k, item] : entries) {
      if (!first) out += o.item_separator;
      first = false;
      if (o.indent) newline(level + 1);
      json_string(out, k, o.ensure_ascii);
      out += o.key_separator;
      json_value(out, item, o, level + 1, depth + 1);
    }
    if (o.indent) newline(level);
    out.push_back('}');
  } else {
    throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0, 0);
  return out;
}

Value from_json(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return Value(nullptr);
    case boost::json::kind::bool_: return Value(v.get_bool());
    case boost::json::kind::int64: return Value(v.get_int64());
    case boost::json::kind::uint64: {
      auto u = v.get_uint64();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case boost::json::kind::double_: return Value(v.get_double());
    case boost::json::kind::string: return Value(std::string_view(v.get_string()));
    case boost::json::kind::array: {
      std::vector<Value> items;
      items.reserve(v.get_array().size());
      for (const auto& item : v.get_array()) items.push_back(from_json(item));
      return Value::list(std::move(items));
    }
    case boost::json::kind::object: {
      Dict d;
      for (const auto& [k, item] : v.get_object()) d.set(std::string(k), from_json(item));
      return Value::dict(std::move(d));
    }
  }
  return Value(nullptr);
}

}  // namespace tierlm::tmpl
