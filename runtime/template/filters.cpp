// jinja2's filters and tests (filters.py / tests.py semantics), with transformers' tojson.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <unicode/uchar.h>

#include "runtime/template/builtins.h"
#include "runtime/template/interpreter.h"
#include "runtime/template/text.h"

namespace tierlm::tmpl {

namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, const CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, const CallArgs&);

Value arg(const CallArgs& a, std::size_t i, std::string_view name, Value fallback = Value(nullptr)) {
  auto v = a.take(i, name);
  return v ? *v : fallback;
}

std::size_t py_len(const Value& v) {
  if (v.is_string()) return text::length(v.as_string());
  if (v.is_list()) return v.as_list().items.size();
  if (v.is_dict()) return v.as_dict().entries.size();
  if (v.is_undefined()) return 0;
  throw TemplateError("object of type '" + v.type_name() + "' has no len()");
}

// jinja2's make_attrgetter: "a.b.0" walks getitem with ints for digit parts.
Value get_attribute(Interpreter& in, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return in.getitem(item, attribute);
  Value v = item;
  const std::string& path = attribute.as_string();
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    int64_t index = std::numeric_limits<int64_t>::max();  // past 64 bits: no list is that long, so it is missing
    if (digits) std::from_chars(part.data(), part.data() + part.size(), index);
    v = digits ? in.getitem(v, Value(index)) : in.getitem(v, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

// ignore_case for sort/unique/dictsort/min/max when case_sensitive is false.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(text::lower(v.as_string()));
  return v;
}

std::vector<Value> sorted(Interpreter& in, std::vector<Value> items, bool reverse, bool case_sensitive,
                          const Value& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items) {
    Value key = attribute.is_none() ? item : get_attribute(in, item, attribute);
    keyed.emplace_back(sort_key(key, case_sensitive), std::move(item));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? less_than(b.first, a.first) : less_than(a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// select/reject/selectattr/rejectattr share jinja2's prepare_select_or_reject.
Value select_like(Interpreter& in, const Value& input, const CallArgs& a, bool by_attribute, bool keep_when) {
  std::size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (a.positional.empty()) throw TemplateError("Missing parameter for attribute name");
    attribute = a.positional[next++];
  }
  std::string test;
  CallArgs test_args;
  if (next < a.positional.size()) {
    if (!a.positional[next].is_string()) throw TemplateError("test name must be a string");
    test = a.positional[next++].as_string();
    for (std::size_t i = next; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
    test_args.keyword = a.keyword;
  }
  std::vector<Value> out;
  for (const auto& item : in.iterate(input)) {
    Value subject = by_attribute ? get_attribute(in, item, attribute) : item;
    bool ok = test.empty() ? subject.truthy() : in.apply_test(test, subject, test_args);
    if (ok == keep_when) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_tojson(Interpreter& in, const Value& v, const CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
  Value indent = arg(a, 1, "indent");
  Value separators = arg(a, 2, "separators");
  o.sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
  if (indent.is_int()) {
    auto width = static_cast<std::size_t>(std::max<int64_t>(0, indent.as_int()));
    in.check_size(width);  // the pad is allocated before any output is written
    o.indent = std::string(width, ' ');
  }
  else if (indent.is_string()) o.indent = indent.as_string();
  else if (!indent.is_none()) throw TemplateError("tojson: indent must be an int or a string");
  if (o.indent) o.item_separator = ",";
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.as_list().items.size() != 2 || !separators.as_list().items[0].is_string() ||
        !separators.as_list().items[1].is_string())
      throw TemplateError("tojson: separators must be a pair of strings");
    o.item_separator = separators.as_list().items[0].as_string();
    o.key_separator = separators.as_list().items[1].as_string();
  }
  return Value(to_json(v, o));
}

Value f_trim(Interpreter&, const Value& v, const CallArgs& a) {
  Value chars = arg(a, 0, "chars");
  std::string s = soft_str(v);
  if (chars.is_none()) return Value(text::strip(s, true, true));
  return Value(text::strip_chars(s, soft_str(chars), true, true));
}

Value f_length(Interpreter&, const Value& v, const CallArgs&) { return Value(static_cast<int64_t>(py_len(v))); }
Value f_upper(Interpreter&, const Value& v, const CallArgs&) { return Value(text::upper(soft_str(v))); }
Value f_lower(Interpreter&, const Value& v, const CallArgs&) { return Value(text::lower(soft_str(v))); }
Value f_capitalize(Interpreter&, const Value& v, const CallArgs&) { return Value(text::capitalize(soft_str(v))); }

Value f_title(Interpreter&, const Value& v, const CallArgs&) {
  // jinja2 splits before runs of [-\s({\[<] and upper-cases the first character of each piece.
  std::string s = soft_str(v), out;
  auto cps = text::decode(s);
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || text::is_space(c); };
  std::size_t i = 0;
  while (i < cps.size()) {
    std::size_t j = i;
    if (is_sep(cps[i])) {
      while (j < cps.size() && is_sep(cps[j])) ++j;
    } else {
      while (j < cps.size() && !is_sep(cps[j])) ++j;
    }
    out += text::upper(text::encode(cps, i, i + 1)) + text::lower(text::encode(cps, i + 1, j));
    i = j;
  }
  return Value(out);
}

Value f_replace(Interpreter& in, const Value& v, const CallArgs& a) {
  std::string s = soft_str(v);
  Value count = arg(a, 2, "count");
  CallArgs m;
  m.positional = {Value(soft_str(arg(a, 0, "old"))), Value(soft_str(arg(a, 1, "new")))};
  if (!count.is_none()) m.positional.push_back(count);
  return in.call(*bound_method(in, Value(s), "replace"), m);
}

Value f_default(Interpreter&, const Value& v, const CallArgs& a) {
  Value fallback = arg(a, 0, "default_value", Value(""));
  bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return fallback;
  return v;
}

Value f_join(Interpreter& in, const Value& v, const CallArgs& a) {
  std::string sep = soft_str(arg(a, 0, "d", Value("")));
  Value attribute = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += soft_str(attribute.is_none() ? item : get_attribute(in, item, attribute));
    in.check_size(out.size());
  }
  return Value(out);
}

Value f_first(Interpreter& in, const Value& v, const CallArgs&) {
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, const CallArgs&) {
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_list(Interpreter& in, const Value& v, const CallArgs&) { return Value::list(in.iterate(v)); }
Value f_string(Interpreter&, const Value& v, const CallArgs&) { return Value(soft_str(v)); }
Value f_safe(Interpreter&, const Value& v, const CallArgs&) { return v.is_string() ? v : Value(soft_str(v)); }
Value f_escape(Interpreter&, const Value& v, const CallArgs&) { return Value(html_escape(soft_str(v))); }

Value f_int(Interpreter&, const Value& v, const CallArgs& a) {
  Value fallback = arg(a, 0, "default", Value(0));
  int64_t base = need_int(arg(a, 1, "base", Value(10)), "int");
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) return std::isfinite(v.as_float()) ? Value(int_from_double(v.as_float())) : fallback;
  if (v.is_string()) {
    std::string s = text::strip(v.as_string(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (s.empty()) return fallback;
    char* end = nullptr;
    errno = 0;
    long long n = std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (end && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(n));
    double d = std::strtod(s.c_str(), &end);
    if (end && *end == '\0' && std::isfinite(d)) return Value(int_from_double(d));
  }
  return fallback;
}

Value f_float(Interpreter&, const Value& v, const CallArgs& a) {
  Value fallback = arg(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string()) {
    std::string s = text::strip(v.as_string(), true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(d);
  }
  return fallback;
}

Value f_abs(Interpreter&, const Value& v, const CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    int64_t i = v.is_bool() ? v.as_bool() : v.as_int();
    return Value(i < 0 ? int_neg(i) : i);
  }
  if (v.is_undefined()) v.fail_undefined();
  throw TemplateError("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_items(Interpreter&, const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [k, item] : v.as_dict().entries) items.push_back(Value::list({Value(k), item}, true));
  return Value::list(std::move(items));
}

Value f_dictsort(Interpreter&, const Value& v, const CallArgs& a) {
  if (!v.is_dict()) throw TemplateError("dictsort expects a mapping");
  bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  std::string by = soft_str(arg(a, 1, "by", Value("key")));
  bool reverse = arg(a, 2, "reverse", Value(false)).truthy();
  std::size_t pos = by == "key" ? 0 : by == "value" ? 1 : 2;
  if (pos == 2) throw TemplateError("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items;
  for (const auto& [k, item] : v.as_dict().entries) items.push_back(Value::list({Value(k), item}, true));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(x.as_list().items[pos], case_sensitive), ky = sort_key(y.as_list().items[pos], case_sensitive);
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::list(std::move(items));
}

Value f_map(Interpreter& in, const Value& v, const CallArgs& a) {
  std::vector<Value> out;
  Value attribute = arg(a, 99, "attribute");
  if (!attribute.is_none()) {
    Value fallback = arg(a, 99, "default", Value());
    bool has_default = a.take(99, "default").has_value();
    for (const auto& item : in.iterate(v)) {
      Value x = get_attribute(in, item, attribute);
      out.push_back(x.is_undefined() && has_default ? fallback : x);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) return Value::list(in.iterate(v));
  if (!a.positional[0].is_string()) throw TemplateError("map: filter name must be a string");
  std::string name = a.positional[0].as_string();
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const auto& item : in.iterate(v)) out.push_back(in.apply_filter(name, item, rest));
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, const CallArgs& a) { return select_like(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, const CallArgs& a) { return select_like(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, const CallArgs& a) { return select_like(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, const CallArgs& a) { return select_like(in, v, a, true, false); }

Value f_unique(Interpreter& in, const Value& v, const CallArgs& a) {
  bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  Value attribute = arg(a, 1, "attribute");
  std::vector<Value> out, seen;
  for (const auto& item : in.iterate(v)) {
    Value key = sort_key(attribute.is_none() ? item : get_attribute(in, item, attribute), case_sensitive);
    bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); });
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, const CallArgs& a) {
  bool reverse = arg(a, 0, "reverse", Value(false)).truthy();
  bool case_sensitive = arg(a, 1, "case_sensitive", Value(false)).truthy();
  return Value::list(sorted(in, in.iterate(v), reverse, case_sensitive, arg(a, 2, "attribute")));
}

Value f_min_max(Interpreter& in, const Value& v, const CallArgs& a, bool want_max) {
  bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  Value attribute = arg(a, 1, "attribute");
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  std::size_t best = 0;
  auto key = [&](std::size_t i) {
    return sort_key(attribute.is_none() ? items[i] : get_attribute(in, items[i], attribute), case_sensitive);
  };
  for (std::size_t i = 1; i < items.size(); ++i) {
    if (want_max ? less_than(key(best), key(i)) : less_than(key(i), key(best))) best = i;
  }
  return items[best];
}
Value f_min(Interpreter& in, const Value& v, const CallArgs& a) { return f_min_max(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, const CallArgs& a) { return f_min_max(in, v, a, true); }

Value f_sum(Interpreter& in, const Value& v, const CallArgs& a) {
  Value attribute = arg(a, 0, "attribute");
  Value total = arg(a, 1, "start", Value(0));
  for (const auto& item : in.iterate(v)) {
    Value x = attribute.is_none() ? item : get_attribute(in, item, attribute);
    if (!total.is_number() || !x.is_number()) throw TemplateError("sum: unsupported operand types");
    if (total.is_float() || x.is_float()) total = Value(total.to_double() + x.to_double());
    else total = Value(int_add(need_int(total, "sum"), need_int(x, "sum")));
  }
  return total;
}

Value f_reverse(Interpreter& in, const Value& v, const CallArgs&) {
  if (v.is_string()) {
    auto cps = text::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(text::encode(cps, 0, cps.size()));
  }
  auto items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, const CallArgs& a) {
  int64_t precision = need_int(arg(a, 0, "precision", Value(0)), "round");
  std::string method = soft_str(arg(a, 1, "method", Value("common")));
  if (!v.is_number()) throw TemplateError("round expects a number");
  double x = v.to_double(), scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "common") {
    if (!v.is_float()) return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;  // Python round(int)
    return Value(std::nearbyint(x * scale) / scale);
  }
  if (method == "ceil") return Value(std::ceil(x * scale) / scale);
  if (method == "floor") return Value(std::floor(x * scale) / scale);
  throw TemplateError("method must be common, ceil or floor");
}

Value f_indent(Interpreter& in, const Value& v, const CallArgs& a) {
  Value width = arg(a, 0, "width", Value(4));
  bool first = arg(a, 1, "first", Value(false)).truthy();
  bool blank = arg(a, 2, "blank", Value(false)).truthy();
  std::string pad;
  if (width.is_string()) {
    pad = width.as_string();
  } else {
    auto n = static_cast<std::size_t>(std::max<int64_t>(0, need_int(width, "indent")));
    in.check_size(n);
    pad.assign(n, ' ');
  }
  std::string s = soft_str(v);
  // jinja2: s += "\n"; lines = s.splitlines(); the first line is never indented unless `first`, empty lines only
  // when `blank`.
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (true) {
    std::size_t nl = s.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(s.substr(start));
      break;
    }
    lines.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  std::string out = lines[0];
  for (std::size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  if (first) out = pad + out;
  return Value(out);
}

Value f_count(Interpreter& in, const Value& v, const CallArgs& a) { return f_length(in, v, a); }

Value f_wordcount(Interpreter&, const Value& v, const CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : text::decode(soft_str(v))) {
    bool w = c == '_' || u_isalnum(static_cast<UChar32>(c));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_batch(Interpreter& in, const Value& v, const CallArgs& a) {
  int64_t size = need_int(arg(a, 0, "linecount", Value()), "batch");
  if (size <= 0) throw TemplateError("batch size must be positive");
  Value fill = arg(a, 1, "fill_with");
  std::vector<Value> out, tmp;
  for (const auto& item : in.iterate(v)) {
    tmp.push_back(item);
    if (static_cast<int64_t>(tmp.size()) == size) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
  }
  if (!tmp.empty()) {
    if (!fill.is_none()) {
      in.count_iterations(static_cast<std::size_t>(size) - tmp.size());  // a huge batch size would pad without end
      while (static_cast<int64_t>(tmp.size()) < size) tmp.push_back(fill);
    }
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_attr(Interpreter& in, const Value& v, const CallArgs& a) { return in.getattr(v, soft_str(arg(a, 0, "name"))); }

Value f_center(Interpreter& in, const Value& v, const CallArgs& a) {
  std::string s = soft_str(v);
  int64_t width = need_int(arg(a, 0, "width", Value(80)), "center");
  int64_t len = static_cast<int64_t>(text::length(s));
  if (width <= len) return Value(s);
  in.check_size(static_cast<std::size_t>(width));
  int64_t total = width - len, left = total / 2 + (total & width & 1);
  return Value(std::string(static_cast<std::size_t>(left), ' ') + s + std::string(static_cast<std::size_t>(total - left), ' '));
}

Value f_format(Interpreter& in, const Value& v, const CallArgs& a) {
  if (!a.keyword.empty()) throw TemplateError("format: keyword arguments are not supported");
  return Value(printf_format(in, soft_str(v), Value::list(a.positional, true)));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"tojson", f_tojson}, {"trim", f_trim}, {"length", f_length}, {"count", f_count}, {"upper", f_upper},
      {"lower", f_lower}, {"title", f_title}, {"capitalize", f_capitalize}, {"replace", f_replace},
      {"default", f_default}, {"d", f_default}, {"join", f_join}, {"first", f_first}, {"last", f_last},
      {"list", f_list}, {"string", f_string}, {"int", f_int}, {"float", f_float}, {"abs", f_abs},
      {"items", f_items}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"map", f_map},
      {"select", f_select}, {"reject", f_reject}, {"unique", f_unique}, {"sort", f_sort}, {"reverse", f_reverse},
      {"round", f_round}, {"indent", f_indent}, {"safe", f_safe}, {"escape", f_escape}, {"e", f_escape},
      {"forceescape", f_escape}, {"wordcount", f_wordcount}, {"dictsort", f_dictsort}, {"batch", f_batch},
      {"min", f_min}, {"max", f_max}, {"sum", f_sum}, {"attr", f_attr}, {"center", f_center},
      {"format", f_format},
  };
  return table;
}

bool t_defined(Interpreter&, const Value& v, const CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, const CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, const CallArgs&) { return v.is_bool(); }
bool t_false(Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_true(Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, const CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, const CallArgs&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, const CallArgs&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, const CallArgs&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, const CallArgs&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_sequence(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_callable(Interpreter&, const Value& v, const CallArgs&) { return v.is_callable(); }
bool t_escaped(Interpreter&, const Value&, const CallArgs&) { return false; }
bool t_even(Interpreter&, const Value& v, const CallArgs&) { return need_int(v, "even") % 2 == 0; }
bool t_odd(Interpreter&, const Value& v, const CallArgs&) { return need_int(v, "odd") % 2 != 0; }
bool t_divisibleby(Interpreter&, const Value& v, const CallArgs& a) {
  int64_t d = need_int(arg(a, 0, "num"), "divisibleby");
  if (d == 0) throw TemplateError("integer division or modulo by zero");
  const int64_t x = need_int(v, "divisibleby");
  return d == -1 || x % d == 0;  // INT64_MIN % -1 is undefined in C++
}
bool t_lower(Interpreter&, const Value& v, const CallArgs&) { std::string s = soft_str(v); return text::lower(s) == s; }
bool t_upper(Interpreter&, const Value& v, const CallArgs&) { std::string s = soft_str(v); return text::upper(s) == s; }
bool t_eq(Interpreter&, const Value& v, const CallArgs& a) { return equals(v, arg(a, 0, "other")); }
bool t_ne(Interpreter&, const Value& v, const CallArgs& a) { return !equals(v, arg(a, 0, "other")); }
bool t_lt(Interpreter&, const Value& v, const CallArgs& a) { return less_than(v, arg(a, 0, "other")); }
bool t_le(Interpreter&, const Value& v, const CallArgs& a) { return !less_than(arg(a, 0, "other"), v); }
bool t_gt(Interpreter&, const Value& v, const CallArgs& a) { return less_than(arg(a, 0, "other"), v); }
bool t_ge(Interpreter&, const Value& v, const CallArgs& a) { return !less_than(v, arg(a, 0, "other")); }
bool t_sameas(Interpreter&, const Value& v, const CallArgs& a) {
  Value o = arg(a, 0, "other");
  if (v.is_none() || v.is_bool()) return equals(v, o) && v.type_name() == o.type_name();
  return false;
}
bool t_in(Interpreter&, const Value& v, const CallArgs& a) {
  Value seq = arg(a, 0, "seq");
  if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
  if (seq.is_list())
    return std::any_of(seq.as_list().items.begin(), seq.as_list().items.end(), [&](const Value& x) { return equals(x, v); });
  if (seq.is_dict()) return v.is_string() && seq.as_dict().find(v.as_string());
  return false;
}
bool t_filter(Interpreter&, const Value& v, const CallArgs&) { return v.is_string() && has_filter(v.as_string()); }
bool t_test(Interpreter&, const Value& v, const CallArgs&) { return v.is_string() && has_test(v.as_string()); }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"false", t_false}, {"true", t_true}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
      {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
      {"callable", t_callable}, {"escaped", t_escaped}, {"even", t_even}, {"odd", t_odd},
      {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper}, {"eq", t_eq}, {"equalto", t_eq},
      {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le},
      {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge},
      {"sameas", t_sameas}, {"in", t_in}, {"filter", t_filter}, {"test", t_test},
  };
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(std::string(name)) > 0; }
bool has_test(std::string_view name) { return tests().count(std::string(name)) > 0; }

Value run_filter(Interpreter& in, const std::string& name, const Value& input, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw TemplateError("No filter named " + string_repr(name) + ".");
  return it->second(in, input, args);
}

bool run_test(Interpreter& in, const std::string& name, const Value& input, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw TemplateError("No test named " + string_repr(name) + ".");
  return it->second(in, input, args);
}

}  // namespace tierlm::tmpl
