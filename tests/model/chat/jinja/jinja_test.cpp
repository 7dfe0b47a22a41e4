// The Jinja interpreter on its own: each case a template, its variables (JSON) and what jinja2
// renders (checked with Python's jinja2 under transformers' settings when written), or the error
// it raises. The whole templates are checked against jinja2 itself by conformance_test.py.
#include <string>
#include <variant>

#include <gtest/gtest.h>

#include "model/chat/jinja/json_input.hpp"
#include "model/chat/jinja/template.hpp"

namespace mqlm::model::jinja {
namespace {

struct Case {
  std::string source;
  std::string variables;  // JSON object
  std::string expected;   // the output, or (with fails) a part of the error
  bool fails = false;
};

std::variant<std::string, TemplateError> render(const std::string& source, const std::string& variables = "{}",
                                                const RenderOptions& options = {}) {
  auto parsed = Template::parse(source);
  if (auto* error = std::get_if<TemplateError>(&parsed)) return *error;
  auto context = value_from_json(nlohmann::ordered_json::parse(variables));
  return std::get<Template>(parsed).render(std::get<Value>(context).as_object(), options);
}

void check(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    auto result = render(c.source, c.variables);
    if (c.fails) {
      ASSERT_TRUE(std::holds_alternative<TemplateError>(result)) << c.source << " rendered " << std::get<std::string>(result);
      EXPECT_NE(std::get<TemplateError>(result).message.find(c.expected), std::string::npos)
          << c.source << ": " << std::get<TemplateError>(result).message;
    } else {
      ASSERT_TRUE(std::holds_alternative<std::string>(result)) << c.source << ": " << std::get<TemplateError>(result).message;
      EXPECT_EQ(std::get<std::string>(result), c.expected) << c.source;
    }
  }
}

TEST(Jinja, WhitespaceControlAsTransformersSetsIt) {
  check({
      {"  {% if true %}\n  x\n  {% endif %}\n  y\n", "{}", "  x\n  y"},  // lstrip, trim, last newline
      {"a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc"},
      {"a\n  {%+ if true %}b{% endif +%}\nc", "{}", "a\n  b\nc"},
      {"{{ 'x' }}\n{# note #}\n{{- ' y' }}", "{}", "x\n y"},  // {{- strips only back to the comment
      {"<{{- ' a ' -}}>", "{}", "< a >"},
      {"line\r\nnext", "{}", "line\nnext"},
      {"{% raw %}{{ not evaluated }}{% endraw %}", "{}", "{{ not evaluated }}"},
  });
}

TEST(Jinja, ValuesPrintAsPythonPrintsThem) {
  check({
      {"{{ none }} {{ true }} {{ 1.0 }} {{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7 % 3 }} {{ 1e20 }} {{ 1e-5 }}", "{}",
       "None True 1.0 0.5 2.0 3 2 1e+20 1e-05"},
      {"{{ {'a': 1, 'b': [1, 2.5, none, true, \"x'y\"]} }}", "{}", "{'a': 1, 'b': [1, 2.5, None, True, \"x'y\"]}"},
      {"{{ (1, 'a') }} {{ x }}", R"({"x": {"k": [1, "v"]}})", "(1, 'a') {'k': [1, 'v']}"},
      {"{{ 0.1 + 0.2 }} {{ 2 ** 10 }} {{ 'ab' * 2 }} {{ [1] + [2] }}", "{}", "0.30000000000000004 1024 abab [1, 2]"},
  });
}

TEST(Jinja, TojsonIsTransformersJsonDumps) {
  check({
      {"{{ x | tojson }}", R"({"x": {"b": [1, 2.5, null, true], "a": "é\"\n"}})",
       "{\"b\": [1, 2.5, null, true], \"a\": \"é\\\"\\n\"}"},
      {"{{ x | tojson(indent=2) }}", R"({"x": {"a": [1, {}], "b": []}})", "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"},
      {"{{ x | tojson(separators=(',', ':'), sort_keys=true) }}", R"({"x": {"b": 1, "a": 2}})", "{\"a\":2,\"b\":1}"},
      {"{{ 'é' | tojson(ensure_ascii=true) }}", "{}", "\"\\u00e9\""},
      {"{{ [1, 2] | map('string') | tojson }}", "{}", "Object of type generator is not JSON serializable", true},
      {"{{ nothing | tojson }}", "{}", "Undefined is not JSON serializable", true},
  });
}

TEST(Jinja, UndefinedBehavesAsJinja2sDefault) {
  check({
      {"[{{ missing }}]{% if not missing %}falsy{% endif %}{{ missing | length }}{{ missing ~ 'x' }}", "{}", "[]falsy0x"},
      {"{{ d.nope }}|{{ none.nope }}|{{ 'a'.nope }}|{{ d['nope'] is defined }}", R"({"d": {}})", "|||False"},
      {"{{ missing | default('fallback') }} {{ '' | default('empty', true) }}", "{}", "fallback empty"},
      {"{{ missing.attribute }}", "{}", "'missing' is undefined", true},
      {"{{ d.nope.deeper }}", R"({"d": {}})", "'dict object' has no attribute 'nope'", true},
      {"{{ missing + 1 }}", "{}", "'missing' is undefined", true},
      {"{{ missing() }}", "{}", "'missing' is undefined", true},
      {"{% for x in missing %}{{ x }}{% else %}empty{% endfor %}", "{}", "empty"},
  });
}

TEST(Jinja, ScopesFollowJinja2) {
  check({
      // A set in a loop body lasts for its iteration only; a namespace carries values out.
      {"{% set x = 0 %}{% for i in [1,2,3] %}{{ x }}{% if i == 1 %}{% set x = 5 %}{% endif %}{{ x }},{% endfor %}{{ x }}",
       "{}", "05,00,00,0"},
      {"{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "{}", "6"},
      // A macro sees its template's variables as they are when it is called.
      {"{% macro m() %}{{ g }}{% endmacro %}{% set g = 1 %}{{ m() }}{% set g = 2 %}{{ m() }}", "{}", "12"},
      {"{% if true %}{% set y = 3 %}{% endif %}{{ y }}", "{}", "3"},
      {"{% set t %}a{{ 1 }}b{% endset %}{{ t }}|{% set u | upper %}x{% endset %}{{ u }}", "{}", "a1b|X"},
      {"{% set a, b = [1, 2] %}{{ b }}{{ a }}", "{}", "21"},
  });
}

TEST(Jinja, LoopsAndMacros) {
  check({
      {"{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ '|' if not loop.last }}{% endfor %}", "{}", "1a|2b|3c"},
      {"{% for x in [1,2,3,4] if x is even %}{{ loop.index0 }}/{{ loop.length }}:{{ x }} {% endfor %}", "{}",
       "0/2:2 1/2:4 "},
      {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"b": 1, "a": 2}})", "b=1;a=2;"},
      {"{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
       "{}", "1"},
      {"{% for x in [1,2] %}{{ loop.previtem is defined }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }} {% endfor %}", "{}",
       "False2a Trueb "},
      {"{% macro greet(name, greeting='Hi') %}{{ greeting }} {{ name }}{% endmacro %}{{ greet('A') }}, {{ greet('B', greeting='Yo') }}",
       "{}", "Hi A, Yo B"},
      {"{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside{% endcall %}", "{}", "[inside]"},
      {"{% filter upper %}shout {{ 'this' }}{% endfilter %}", "{}", "SHOUT THIS"},
      {"{% generation %}kept{% endgeneration %}", "{}", "kept"},
  });
}

TEST(Jinja, ExpressionsFiltersTestsAndMethods) {
  check({
      {"{{ 'a' if x else 'b' }}{{ 'c' if not x }}{{ 1 < 2 < 3 }}{{ 'b' in 'abc' }}{{ 2 not in [1] }}", R"({"x": false})",
       "bcTrueTrueTrue"},
      {"{{ s[1:] }}|{{ s[::-1] }}|{{ s[-2] }}|{{ xs[1:3] }}|{{ 'héllo'[1] }}", R"({"s": "hello", "xs": [1,2,3,4]})",
       "ello|olleh|l|[2, 3]|é"},
      {"{{ '  a b  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'x y  z'.split() }}|{{ 'ab'.upper() }}|{{ 'hi {}!'.format('you') }}",
       "{}", "a b|['a', 'b', '', 'c']|['x', 'y', 'z']|AB|hi you!"},
      // d.items is the method (Python's attribute comes first), d['items'] the item.
      {"{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.keys() | list }}{{ d | length }}{{ d['items'] }}{{ d.items is callable }}",
       R"({"d": {"a": 1, "items": 5}})", "10['a', 'items']25True"},
      {"{{ xs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}",
       R"({"xs": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "c"}]})",
       "a, c"},
      {"{{ [3, 1, 2] | sort | list }} {{ ['b', 'A'] | sort }} {{ {'b': 1, 'a': 2} | dictsort }} {{ [1, 1, 2] | unique | list }}",
       "{}", "[1, 2, 3] ['A', 'b'] [('a', 2), ('b', 1)] [1, 2]"},
      {"{{ 'a\nb' | indent(2) }}|{{ '  x ' | trim }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|{{ '3' | int + 1 }}",
       "{}", "a\n  b|x|Hello World|Hello|4"},
      {"{{ x is string }}{{ x is mapping }}{{ 1 is number }}{{ none is none }}{{ [] is sequence }}{{ 4 is divisibleby 2 }}",
       R"({"x": "s"})", "TrueFalseTrueTrueTrueTrue"},
      {"{{ ('<b>' | safe) + '<i>' }}|{{ '<' ~ ('x' | safe) }}", "{}", "<b>&lt;i&gt;|<x"},
      {"{{ strftime_now('%Y-%m-%d') }}", "{}", "1970-01-01"},
  });
}

TEST(Jinja, ErrorsSayWhatAndWhere) {
  check({
      {"{{ raise_exception('No system role, please') }}", "{}", "No system role, please", true},
      {"line one\n{{ 'a' + 1 }}", "{}", "line 2: can only concatenate str (not \"int\") to str", true},
      {"{{ x | no_such_filter }}", "{}", "no filter named 'no_such_filter'", true},
      {"{% for x in [1] %}", "{}", "expected 'endfor'", true},
      {"{% include 'other.jinja' %}", "{}", "unknown tag 'include'", true},
      {"{{ [1].append(2) }}", "{}", "access to attribute 'append' of 'list' object is unsafe", true},
      {"{{ 1 / 0 }}", "{}", "division by zero", true},
      {"{{ 'a' < 1 }}", "{}", "'<' not supported between instances of 'str' and 'int'", true},
      {"{{ (", "{}", "line 1: a {{ is not closed", true},
      {"{{ ) }}", "{}", "unexpected ')'", true},
  });
  auto raised = render("{{ raise_exception('bad roles') }}");
  EXPECT_TRUE(std::get<TemplateError>(raised).raised);
  EXPECT_FALSE(std::get<TemplateError>(render("{{ 1 / 0 }}")).raised);
}

// ---- hostile templates: each ends with an error naming the limit, quickly ----

std::string error_of(const std::string& source, const RenderOptions& options = {}) {
  auto result = render(source, "{}", options);
  if (auto* error = std::get_if<TemplateError>(&result)) return error->message;
  ADD_FAILURE() << source << " rendered";
  return {};
}

// Numbers past what the interpreter holds are errors or what Python makes of them, never an
// exception out of the library (jinja.fuzz found `loop.4444...` escaping as std::out_of_range).
TEST(Jinja, HugeNumbersInTheSourceAreErrorsNotCrashes) {
  check({{"{{ loop.44444444444444444444444444444 }}", "{}", "does not fit in 64 bits", true},
         {"{{ 99999999999999999999999 }}", "{}", "does not fit in 64 bits", true},
         {"{{ '{99999999999999999999999}'.format(1) }}", "{}", "out of range", true},
         {"{{ [{'a': 1}] | map(attribute='99999999999999999999999') | list | length }}", "{}", "1"},
         {"{{ 1e999 > 1e308 }}", "{}", "True"},
         {"{{ [1] | tojson(indent=nothing) }}", "{}", "expected an int", true}});
}

// Arithmetic past 64 bits is an error, found before the overflow (undefined in C++; jinja.fuzz
// found the product under UBSan), and the sums and products below it are Python's.
TEST(Jinja, IntegerArithmeticPast64BitsIsAnError) {
  check({{"{{ 90532596 * 646668853801 }}", "{}", "outgrew 64 bits", true},
         {"{{ 9223372036854775807 + 1 }}", "{}", "outgrew 64 bits", true},
         {"{{ -9223372036854775807 - 2 }}", "{}", "outgrew 64 bits", true},
         {"{{ (-9223372036854775807 - 1) // -1 }}", "{}", "outgrew 64 bits", true},
         {"{{ (-9223372036854775807 - 1) % -1 }}", "{}", "0"},
         {"{{ 3037000499 * 3037000499 }} {{ -7 // 2 }} {{ -7 % 2 }}", "{}", "9223372030926249001 -4 1"}});
}

TEST(JinjaLimits, EndlessLoopsRunOutOfSteps) {
  RenderOptions options;
  options.limits.max_steps = 100'000;
  EXPECT_NE(error_of("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", options)
                .find("more than 100000 steps"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(1000000) }}").find("Range too big"), std::string::npos);
}

TEST(JinjaLimits, RecursionOutputAndMemoryAreBounded) {
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("more than 64 deep"), std::string::npos);
  RenderOptions small;
  small.limits.max_output_bytes = 1 << 20;
  EXPECT_NE(error_of("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", small).find("longer than 1 MiB"),
            std::string::npos);
  // Doubling a string: 2^40 bytes if nothing stopped it.
  small.limits.max_string_bytes = 16 << 20;
  EXPECT_NE(error_of("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", small)
                .find("more than 16 MiB of strings"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}")
                .find("nest more than 256"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = ns %}").find("cannot hold a namespace"), std::string::npos);
  // Macros recursing through blocks nested as deep as the parser allows: bounded as it runs.
  std::string nested = "{% macro f(n) %}";
  for (int i = 0; i < 100; ++i) nested += "{% if n < 64 %}";
  nested += "{{ f(n + 1) }}";
  for (int i = 0; i < 100; ++i) nested += "{% endif %}";
  EXPECT_NE(error_of(nested + "{% endmacro %}{{ f(0) }}").find("nests more than 1500"), std::string::npos);
}

TEST(JinjaLimits, DeepNestingInTheSourceIsASyntaxError) {
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("nests deeper"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nests deeper"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '-') + "1 }}").find("nests deeper"), std::string::npos);
}

}  // namespace
}  // namespace mqlm::model::jinja
