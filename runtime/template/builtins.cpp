#include "runtime/template/builtins.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <unordered_map>

#include <unicode/uchar.h>

#include "runtime/template/interpreter.h"
#include "runtime/template/text.h"

namespace tierlm::tmpl {

int64_t need_int(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  if (v.is_undefined()) v.fail_undefined();
  throw TemplateError(std::string(what) + " expects an integer, got " + v.type_name());
}

std::string soft_str(const Value& v) {
  return to_str(v);  // undefined (even a sandbox-forbidden one) prints as ""
}

namespace {

Value arg_or(const CallArgs& a, std::size_t i, std::string_view name, Value fallback) {
  auto v = a.take(i, name);
  return v ? *v : fallback;
}

const std::string& need_string(const Value& v, const char* what) {
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_string()) throw TemplateError(std::string(what) + " expects a string, got " + v.type_name());
  return v.as_string();
}

// Code-point index of a byte offset.
int64_t cp_index(const std::string& s, std::size_t byte) { return static_cast<int64_t>(text::length(std::string_view(s).substr(0, byte))); }

std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  auto cps = text::decode(s);
  std::size_t i = 0, n = cps.size();
  while (i < n) {
    while (i < n && text::is_space(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      std::size_t e = n;
      while (e > i && text::is_space(cps[e - 1])) --e;
      out.push_back(text::encode(cps, i, e));
      return out;
    }
    std::size_t j = i;
    while (j < n && !text::is_space(cps[j])) ++j;
    out.push_back(text::encode(cps, i, j));
    i = j;
  }
  return out;
}

std::vector<std::string> split_on(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) throw TemplateError("empty separator");
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    std::size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    out.push_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::vector<std::string> rsplit_on(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) throw TemplateError("empty separator");
  std::vector<std::string> out;
  std::size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    std::size_t hit = s.rfind(sep, end - sep.size());
    if (hit == std::string::npos) break;
    out.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
    end = hit;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Value strings_to_list(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  for (const auto& p : parts) items.emplace_back(p);
  return Value::list(std::move(items));
}

std::string replace_all(Interpreter& in, const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` between every code point (and at both ends).
    auto cps = text::decode(s);
    int64_t done = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) text::append_utf8(out, cps[i]);
      in.check_size(out.size());
    }
    return out;
  }
  std::size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    std::size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += with;
    in.check_size(out.size());
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  in.check_size(out.size());
  return out;
}

// str.startswith / endswith with a str or a tuple of str.
bool affix(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (what.is_list()) {
    for (const auto& item : what.as_list().items)
      if (one(need_string(item, prefix ? "startswith" : "endswith"))) return true;
    return false;
  }
  return one(need_string(what, prefix ? "startswith" : "endswith"));
}

std::string format_method(Interpreter& in, const std::string& fmt, const CallArgs& a) {
  std::string out;
  std::size_t auto_index = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out.push_back('{');
        ++i;
        continue;
      }
      std::size_t close = fmt.find('}', i);
      if (close == std::string::npos) throw TemplateError("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        throw TemplateError("str.format: format specs and conversions are not supported");
      Value v;
      if (field.empty()) {
        if (auto_index >= a.positional.size()) throw TemplateError("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
        v = a.positional[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        std::size_t idx = std::numeric_limits<std::size_t>::max();  // past 64 bits: out of range like any too large
        std::from_chars(field.data(), field.data() + field.size(), idx);
        if (idx >= a.positional.size()) throw TemplateError("Replacement index " + field + " out of range for positional args tuple");
        v = a.positional[idx];
      } else {
        bool found = false;
        for (const auto& [k, kv] : a.keyword)
          if (k == field) {
            v = kv;
            found = true;
          }
        if (!found) throw TemplateError(string_repr(field));
      }
      out += soft_str(v);
      i = close;
    } else if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else throw TemplateError("Single '}' encountered in format string");
      out.push_back('}');
    } else {
      out.push_back(c);
    }
    in.check_size(out.size());
  }
  return out;
}

Value method(const std::string& name, std::function<Value(const CallArgs&)> fn) { return Value::function(name, std::move(fn)); }

std::optional<Value> string_method(Interpreter& in, const std::string& s, const std::string& name) {
  Interpreter* ip = &in;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method(name, [s, left, right](const CallArgs& a) {
      Value chars = arg_or(a, 0, "chars", Value(nullptr));
      if (chars.is_none()) return Value(text::strip(s, left, right));
      return Value(text::strip_chars(s, need_string(chars, "strip"), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool reverse = name == "rsplit";
    return method(name, [s, reverse](const CallArgs& a) {
      Value sep = arg_or(a, 0, "sep", Value(nullptr));
      int64_t maxsplit = need_int(arg_or(a, 1, "maxsplit", Value(-1)), "split");
      if (sep.is_none()) {
        if (reverse && maxsplit >= 0) throw TemplateError("rsplit(None, maxsplit) is not supported");
        return strings_to_list(split_whitespace(s, maxsplit));
      }
      const auto& sp = need_string(sep, "split");
      return strings_to_list(reverse ? rsplit_on(s, sp, maxsplit) : split_on(s, sp, maxsplit));
    });
  }
  if (name == "splitlines") {
    return method(name, [s](const CallArgs& a) {
      bool keep = arg_or(a, 0, "keepends", Value(false)).truthy();
      std::vector<std::string> lines;
      std::size_t start = 0;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          std::size_t end = i;
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          lines.push_back(s.substr(start, (keep ? i + 1 : end) - start));
          start = i + 1;
        }
      }
      if (start < s.size()) lines.push_back(s.substr(start));
      return strings_to_list(lines);
    });
  }
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method(name, [s, prefix](const CallArgs& a) {
      if (a.positional.empty()) throw TemplateError("startswith/endswith need an argument");
      if (a.positional.size() > 1) throw TemplateError("startswith/endswith with start/end are not supported");
      return Value(affix(s, a.positional[0], prefix));
    });
  }
  if (name == "replace") {
    return method(name, [s, ip](const CallArgs& a) {
      if (a.positional.size() < 2) throw TemplateError("replace expected at least 2 arguments");
      int64_t count = need_int(arg_or(a, 2, "count", Value(-1)), "replace");
      return Value(replace_all(*ip, s, need_string(a.positional[0], "replace"), need_string(a.positional[1], "replace"), count));
    });
  }
  if (name == "upper") return method(name, [s](const CallArgs&) { return Value(text::upper(s)); });
  if (name == "lower") return method(name, [s](const CallArgs&) { return Value(text::lower(s)); });
  if (name == "title") return method(name, [s](const CallArgs&) { return Value(text::title(s)); });
  if (name == "capitalize") return method(name, [s](const CallArgs&) { return Value(text::capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method(name, [s, name](const CallArgs& a) {
      if (a.positional.empty()) throw TemplateError(name + " expected an argument");
      if (a.positional.size() > 1) throw TemplateError(name + " with start/end is not supported");
      const auto& sub = need_string(a.positional[0], name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(text::length(s) + 1));
        int64_t n = 0;
        for (std::size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      std::size_t hit = (name[0] == 'r') ? s.rfind(sub) : s.find(sub);
      if (hit == std::string::npos) {
        if (name == "index" || name == "rindex") throw TemplateError("substring not found");
        return Value(int64_t(-1));
      }
      return Value(cp_index(s, hit));
    });
  }
  if (name == "join") {
    return method(name, [s, ip](const CallArgs& a) {
      if (a.positional.empty()) throw TemplateError("join expected an argument");
      std::string out;
      bool first = true;
      for (const auto& item : ip->iterate(a.positional[0])) {
        if (!first) out += s;
        first = false;
        out += need_string(item, "join");
        ip->check_size(out.size());
      }
      return Value(out);
    });
  }
  if (name == "format") return method(name, [s, ip](const CallArgs& a) { return Value(format_method(*ip, s, a)); });
  if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    return method(name, [s, prefix](const CallArgs& a) {
      std::string x = need_string(arg_or(a, 0, "prefix", Value()), "removeprefix");
      if (!affix(s, Value(x), prefix)) return Value(s);
      return Value(prefix ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    return method(name, [s, name](const CallArgs&) {
      auto cps = text::decode(s);
      if (cps.empty()) return Value(false);
      if (name == "isupper" || name == "islower") {
        bool cased = false;
        for (char32_t c : cps) {
          if (u_isULowercase(static_cast<UChar32>(c))) {
            if (name == "isupper") return Value(false);
            cased = true;
          } else if (u_isUUppercase(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) {
            if (name == "islower") return Value(false);
            cased = true;
          }
        }
        return Value(cased);
      }
      for (char32_t c : cps) {
        bool ok = name == "isspace" ? text::is_space(c)
                  : name == "isdigit" ? u_isdigit(static_cast<UChar32>(c)) != 0
                  : name == "isalpha" ? u_isalpha(static_cast<UChar32>(c)) != 0
                                      : (u_isalpha(static_cast<UChar32>(c)) || u_isdigit(static_cast<UChar32>(c)));
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> bound_method(Interpreter& in, const Value& object, const std::string& name) {
  Interpreter* ip = &in;
  if (object.is_string()) return string_method(in, object.as_string(), name);
  if (object.is_dict()) {
    auto d = object;
    if (name == "items") {
      return method(name, [d](const CallArgs&) {
        std::vector<Value> items;
        for (const auto& [k, v] : d.as_dict().entries) items.push_back(Value::list({Value(k), v}, true));
        return Value::list(std::move(items));
      });
    }
    if (name == "keys" || name == "values") {
      bool keys = name == "keys";
      return method(name, [d, keys](const CallArgs&) {
        std::vector<Value> items;
        for (const auto& [k, v] : d.as_dict().entries) items.push_back(keys ? Value(k) : v);
        return Value::list(std::move(items));
      });
    }
    if (name == "get") {
      return method(name, [d](const CallArgs& a) {
        if (a.positional.empty()) throw TemplateError("get expected at least 1 argument, got 0");
        Value fallback = a.positional.size() > 1 ? a.positional[1] : Value(nullptr);
        if (!a.positional[0].is_string()) return fallback;
        const Value* v = d.as_dict().find(a.positional[0].as_string());
        return v ? *v : fallback;
      });
    }
    if (name == "copy") return method(name, [d](const CallArgs&) { return Value::dict(d.as_dict()); });
    if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear")
      return Value(Undefined{"access to attribute " + string_repr(name) + " of 'dict' object is unsafe.", true});
    return std::nullopt;
  }
  if (object.is_list()) {
    auto l = object;
    if (name == "index" || name == "count") {
      bool index = name == "index";
      return method(name, [l, index](const CallArgs& a) {
        if (a.positional.empty()) throw TemplateError("expected an argument");
        int64_t n = 0;
        const auto& items = l.as_list().items;
        for (std::size_t i = 0; i < items.size(); ++i)
          if (equals(items[i], a.positional[0])) {
            if (index) return Value(static_cast<int64_t>(i));
            ++n;
          }
        if (index) throw TemplateError(to_repr(a.positional[0]) + " is not in list");
        return Value(n);
      });
    }
    if (!object.as_list().tuple &&
        (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
         name == "reverse" || name == "sort" || name == "clear"))
      return Value(Undefined{"access to attribute " + string_repr(name) + " of 'list' object is unsafe.", true});
    return std::nullopt;
  }
  (void)ip;
  return std::nullopt;
}

namespace {

// snprintf into a string sized by a first measuring call: no fixed buffer to truncate or leave unterminated.
template <class T>
std::string c_format(const std::string& fmt, T value) {
  int n = std::snprintf(nullptr, 0, fmt.c_str(), value);
  if (n < 0) throw TemplateError("format specification '" + fmt + "' cannot be applied");
  std::string out(static_cast<std::size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt.c_str(), value);
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// Width and precision of a %-spec, each bounded so a hostile "%999999999999d" is an error, not a huge string.
void check_format_spec(Interpreter& in, const std::string& spec) {
  std::size_t number = 0;
  for (char c : spec) {
    if (c >= '0' && c <= '9') {
      number = number * 10 + static_cast<std::size_t>(c - '0');
      if (number > 1'000'000) throw TemplateError("format width or precision too large: %" + spec);
      in.check_size(number);
    } else {
      number = 0;
    }
  }
}

}  // namespace

std::string printf_format(Interpreter& in, const std::string& format, const Value& args) {
  std::vector<Value> values;
  if (args.is_list() && args.as_list().tuple) values = args.as_list().items;
  else values.push_back(args);
  std::string out;
  std::size_t next = 0;
  for (std::size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) throw TemplateError("incomplete format");
    std::string spec;
    while (i < format.size() && std::string_view("0123456789.-+ #").find(format[i]) != std::string_view::npos) spec.push_back(format[i++]);
    if (i >= format.size()) throw TemplateError("incomplete format");
    char conv = format[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= values.size()) throw TemplateError("not enough arguments for format string");
    const Value& v = values[next++];
    check_format_spec(in, spec);
    if (conv == 's' || conv == 'r') {
      std::string s = conv == 's' ? soft_str(v) : to_repr(v);
      if (spec.empty()) out += s;
      else out += c_format("%" + spec + "s", s.c_str());
    } else if (conv == 'd' || conv == 'i') {
      if (!v.is_number()) throw TemplateError("%d format: a real number is required, not " + v.type_name());
      int64_t n = v.is_float() ? (std::isfinite(v.as_float()) ? int_from_double(v.as_float()) : throw TemplateError("cannot convert float infinity or NaN to integer"))
                               : (v.is_bool() ? v.as_bool() : v.as_int());
      out += c_format("%" + spec + "lld", static_cast<long long>(n));
    } else if (conv == 'f' || conv == 'e' || conv == 'g' || conv == 'F' || conv == 'E' || conv == 'G') {
      if (!v.is_number()) throw TemplateError("must be real number, not " + v.type_name());
      out += c_format("%" + spec + conv, v.to_double());
    } else {
      throw TemplateError(std::string("unsupported format character '") + conv + "'");
    }
    in.check_size(out.size());
  }
  if (next < values.size() && !(values.size() == 1 && values[0].is_dict()))
    throw TemplateError("not all arguments converted during string formatting");
  return out;
}

namespace {
std::atomic<const std::tm*>& fixed_clock() {
  static std::atomic<const std::tm*> fixed{nullptr};
  return fixed;
}
}  // namespace

void set_clock_for_testing(std::optional<std::tm> fixed) {
  static std::tm held{};
  if (fixed) {
    held = *fixed;
    fixed_clock().store(&held);
  } else {
    fixed_clock().store(nullptr);
  }
}

void install_globals(Dict& g) {
  g.set("range", Value::function("range", [](const CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) stop = need_int(a.positional[0], "range");
    else if (a.positional.size() >= 2) {
      start = need_int(a.positional[0], "range");
      stop = need_int(a.positional[1], "range");
      if (a.positional.size() > 2) step = need_int(a.positional[2], "range");
    } else {
      throw TemplateError("range expected at least 1 argument, got 0");
    }
    if (step == 0) throw TemplateError("range() arg 3 must not be zero");
    std::vector<Value> items;
    // Unsigned distances: stop - start and -step overflow int64 for extreme arguments (range(-2**63, 2**63 - 1)).
    uint64_t span = step > 0 ? (stop > start ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) : 0)
                             : (start > stop ? static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) : 0);
    uint64_t stride = step > 0 ? static_cast<uint64_t>(step) : uint64_t(0) - static_cast<uint64_t>(step);
    uint64_t count = span == 0 ? 0 : (span - 1) / stride + 1;
    a.interpreter->count_iterations(static_cast<std::size_t>(count));  // throws past the iteration limit
    for (uint64_t i = 0; i < count; ++i)  // each value lies between start and stop, so it fits
      items.emplace_back(static_cast<int64_t>(static_cast<uint64_t>(start) + i * static_cast<uint64_t>(step)));
    return Value::list(std::move(items));
  }));
  g.set("namespace", Value::function("namespace", [](const CallArgs& a) {
    auto ns = std::make_shared<Namespace>();
    for (const auto& p : a.positional) {
      if (!p.is_dict()) throw TemplateError("namespace() positional argument must be a dict");
      for (const auto& [k, v] : p.as_dict().entries) ns->attributes.set(k, v);
    }
    for (const auto& [k, v] : a.keyword) ns->attributes.set(k, v);
    if (a.interpreter) a.interpreter->own(ns);
    return Value(ns);
  }));
  g.set("dict", Value::function("dict", [](const CallArgs& a) {
    Dict d;
    for (const auto& p : a.positional) {
      if (!p.is_dict()) throw TemplateError("dict() positional argument must be a dict");
      for (const auto& [k, v] : p.as_dict().entries) d.set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d.set(k, v);
    return Value::dict(std::move(d));
  }));
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
    throw TemplateError(a.positional.empty() ? std::string() : soft_str(a.positional[0]));
  }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& a) {
    std::string fmt = need_string(arg_or(a, 0, "format", Value()), "strftime_now");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    if (auto fixed = fixed_clock().load()) local = *fixed;
    char buf[512];
    std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &local);
    return Value(std::string(buf, n));
  }));
}

}  // namespace tierlm::tmpl
