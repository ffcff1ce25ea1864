// Built-ins of the template language: jinja2's filters and tests, the Python str/dict/list methods that chat
// templates call, and the globals transformers provides (raise_exception, strftime_now) next to jinja2's own
// (range, namespace, dict). Mutating methods resolve to sandbox errors, as in ImmutableSandboxedEnvironment.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>

#include "runtime/template/value.h"

namespace tierlm::tmpl {

class Interpreter;

void install_globals(Dict& globals);
// The time strftime_now formats: the local clock, unless a test fixed it (nullopt restores the clock). Golden files
// of templates that print the date (gpt-oss's "Current date:") are rendered at a fixed time on both sides.
void set_clock_for_testing(std::optional<std::tm> fixed);
// The bound method `name` of `object` (str/dict/list methods), an unsafe-undefined for forbidden ones, or nullopt.
std::optional<Value> bound_method(Interpreter& in, const Value& object, const std::string& name);
Value run_filter(Interpreter& in, const std::string& name, const Value& input, const CallArgs& args);
bool run_test(Interpreter& in, const std::string& name, const Value& input, const CallArgs& args);
// An integer argument (a bool counts, as in Python), else a TemplateError naming `what`; the filters' and the
// methods' shared reading of one.
int64_t need_int(const Value& v, const char* what);
// Python's str(x) where jinja2 calls soft_str: undefined (even a sandbox-forbidden one) prints as "".
std::string soft_str(const Value& v);
// Python's "fmt % args" for %s %d %i %f %r %% (the `format` filter and the % operator).
std::string printf_format(Interpreter& in, const std::string& format, const Value& args);

}  // namespace tierlm::tmpl
