// The Jinja engine: golden snippets rendered by jinja2 (tests/golden/chat_template/jinja_snippets.json, from
// tools/reference/chat_template_goldens.py) must render byte-identically or fail where jinja2 fails; plus
// hand-written checks of expressions, whitespace control, unsupported syntax and resource limits.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/jinja.h"

namespace moecel::jinja {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string render(const std::string& src, const ojson& ctx = ojson::object()) {
  return Template(src).render(ctx);
}

// The error message of rendering `src` ("" when it renders).
std::string error_of(const std::string& src, const ojson& ctx = ojson::object()) {
  try {
    Template(src).render(ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Jinja, GoldenSnippets) {
  fs::path path = fs::path(MOECEL_SOURCE_DIR) / "tests/golden/chat_template/jinja_snippets.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "missing " << path.string();
  const ojson golden = ojson::parse(f);
  const ojson& ctx = golden["context"];
  int n = 0;
  for (const ojson& s : golden["snippets"]) {
    ++n;
    const std::string src = s["template"].get<std::string>();
    const std::string label = "snippet " + std::to_string(s["id"].get<int>()) + ": " + src;
    if (s.contains("expected")) {
      try {
        EXPECT_EQ(Template(src).render(ctx), s["expected"].get<std::string>()) << label;
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << "\n  threw: " << e.what();
      }
    } else if (s.contains("raises")) {
      try {
        Template(src).render(ctx);
        ADD_FAILURE() << label << "\n  expected raise_exception";
      } catch (const RaisedError& e) {
        EXPECT_EQ(std::string(e.what()), s["raises"].get<std::string>()) << label;
      }
    } else {
      try {
        Template(src).render(ctx);
        ADD_FAILURE() << label << "\n  rendered, but jinja2 fails with " << s["error"];
      } catch (const RaisedError& e) {
        ADD_FAILURE() << label << "\n  raise_exception instead of an error: " << e.what();
      } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), "template line ")) << label << "\n  error without a line: " << e.what();
      }
    }
  }
  EXPECT_GT(n, 100);
}

TEST(Jinja, Expressions) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 3 ** 2 }}"), "7|9|3|2|64");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 2 }}|{{ [1] + [2] }}"), "a1None|abab|[1, 2]");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }} {{ not true or false }}"),
            "True True True False");
  EXPECT_EQ(render("{{ x or 'd' }} {{ 0 and 1 }} {{ 'y' if x else 'n' }}", {{"x", ""}}), "d 0 n");
  EXPECT_EQ(render("{{ s[1:-1] }} {{ s[::-1] }} {{ l[-1] }}", {{"s", "héllo"}, {"l", {1, 2, 3}}}), "éll olléh 3");
  EXPECT_EQ(
      render("{{ d.a.b }} {{ d['a']['b'] }} {{ d.missing }}|{{ d.missing is defined }}", {{"d", {{"a", {{"b", 5}}}}}}),
      "5 5 |False");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }} {{ 1e100 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ 10 ** 20 // 10 ** 19 if false else 1 }}"),
            "0.30000000000000004 1e+100 1.5 2.0 1");
}

TEST(Jinja, FiltersAndTests) {
  ojson ctx = {{"ms", ojson::parse(R"([{"role":"system","content":" S "},{"role":"user","content":"U"}])")}};
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}", ctx),
            "U");
  EXPECT_EQ(render("{{ ms[0].content | trim | lower }}|{{ ms | length }}|{{ ms | first | tojson }}", ctx),
            R"(s|2|{"role": "system", "content": " S "})");
  EXPECT_EQ(
      render("{{ ms[0] is mapping }} {{ ms is iterable }} {{ 'x' is string }} {{ none is none }} {{ 4 is even }}", ctx),
      "True True True True True");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1, 2.5, 'é']} | tojson }}"), R"({"b": 1, "a": [1, 2.5, "é"]})");
  EXPECT_EQ(render("{{ {'b': 1} | tojson(indent=2) }}"), "{\n  \"b\": 1\n}");
  EXPECT_EQ(render("{{ x | default('none given') }} {{ '  a ' | trim }} {{ 'a-b' | replace('-', '+') }}"),
            "none given a a+b");
}

TEST(Jinja, WhitespaceControl) {
  // transformers' settings: trim_blocks drops the newline after a tag, lstrip_blocks the indent before it.
  EXPECT_EQ(render("{% for i in [1, 2] %}\n  {% if i %}\n{{ i }}\n  {% endif %}\n{% endfor %}\n"), "1\n2\n");
  EXPECT_EQ(render("a   {{- 'b' -}}   c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true %}b{% endif -%}\n  c"), "abc");
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("x {# note #}\ny"), "x y");
  EXPECT_EQ(render("{% raw %}{{ kept }}{% endraw %}"), "{{ kept }}");
  EXPECT_EQ(render("no trailing newline\n"), "no trailing newline");
  Options keep;
  keep.keep_trailing_newline = true;
  keep.trim_blocks = false;
  keep.lstrip_blocks = false;
  EXPECT_EQ(Template("  {% if true %}\nx\n{% endif %}\n", keep).render(ojson::object()), "  \nx\n\n");
}

TEST(Jinja, ScopingLikeJinja2) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}"), "23|1");
  EXPECT_EQ(
      render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
      "6");
  EXPECT_EQ(render("{% if true %}{% set y = 'set in if' %}{% endif %}{{ y }}"), "set in if");
  EXPECT_EQ(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{{ outer }}{% endmacro %}{% set outer = '!' %}{{ m('A') }}"),
            "AB!");
}

TEST(Jinja, RaiseException) {
  try {
    render("{{ raise_exception('bad roles') }}");
    ADD_FAILURE() << "expected RaisedError";
  } catch (const RaisedError& e) {
    EXPECT_STREQ(e.what(), "bad roles");
  }
}

TEST(Jinja, UnsupportedSyntaxIsNamedWithLine) {
  struct Case {
    const char* src;
    const char* expect;
  };
  const Case cases[] = {
      {"ok\n{% include 'other.jinja' %}", "line 2"},
      {"{% include 'other.jinja' %}", "'{% include %}' tag is not supported"},
      {"{% extends 'base' %}", "not supported"},
      {"{% call m() %}x{% endcall %}", "not supported"},
      {"{{ x | truncate(3) }}", "'truncate' filter is not supported"},
      {"{{ x | no_such_filter }}", "no filter named 'no_such_filter'"},
      {"{{ x is no_such_test }}", "no test named 'no_such_test'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
      {"{{ f(*args) }}", "*args and **kwargs"},
      {"{% frobnicate %}", "unknown tag 'frobnicate'"},
      {"\n\n{% for x in y %}\n{% endif %}", "line 4"},
      {"{% for x in y %}", "not closed"},
      {"{% endfor %}", "no open block"},
      {"{% break %}", "outside of a for loop"},
      {"{{ 'open string }}", "unterminated string"},
      {"{# open comment", "missing end of comment"},
      {"{{ x", "missing '}}'"},
      {"{{ }}", "expected an expression"},
      {"{{ (1 }}", "unexpected '}'"},
      {"{{ '{}'.format(1) }}", "str.format() is not supported"},
      {"{{ [1].append(2) }}", "unsafe"},
      {"{{ x.y }}", "'x' is undefined"},
      {"{% set s = 'a' %}{% set s.b = 1 %}", "non-namespace"},
      {"{% set ns = namespace() %}{% set ns._hidden = 1 %}", "underscore"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
      {"{{ 99999999999999999999 }}", "too large"},
  };
  for (const Case& c : cases) {
    std::string err = error_of(c.src);
    EXPECT_TRUE(contains(err, c.expect)) << c.src << "\n  error: " << (err.empty() ? "<rendered>" : err);
  }
}

TEST(Jinja, RuntimeErrorLines) {
  std::string err = error_of("line 1\n{% for m in messages %}\n{{ m.content + 1 }}\n{% endfor %}",
                             {{"messages", ojson::parse(R"([{"content": "x"}])")}});
  EXPECT_TRUE(contains(err, "template line 3")) << err;
  EXPECT_TRUE(contains(err, "can only concatenate str")) << err;
}

TEST(Jinja, DeepNestingFailsCleanly) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const int n = 100000;
  EXPECT_TRUE(contains(error_of("{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of("{{ 1" + repeat(" + 1", n) + " }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of("{{ x" + repeat(".a", n) + " }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of("{{ x" + repeat("|trim", n) + " }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of("{{ " + repeat("not ", n) + "1 }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of("{{ " + repeat("-", n) + "1 }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of("{{ " + repeat("[", n) + repeat("]", n) + " }}"), "nests deeper"));
  EXPECT_TRUE(contains(error_of(repeat("{% if true %}", n) + repeat("{% endif %}", n)), "nests deeper"));
  // Nesting within the limit renders.
  EXPECT_EQ(render(repeat("{% if true %}", 40) + "deep" + repeat("{% endif %}", 40)), "deep");
  EXPECT_EQ(render("{{ " + repeat("(", 30) + "1" + repeat(")", 30) + " }}"), "1");
}

TEST(Jinja, RunawayTemplatesAreStopped) {
  EXPECT_TRUE(contains(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "recursion deeper"));
  EXPECT_TRUE(contains(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                       "loop iterations"));
  EXPECT_TRUE(contains(error_of("{{ range(10 ** 9) | length }}"), "Range too big"));
  EXPECT_TRUE(contains(error_of("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}"
                                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
                       "larger than"));
  EXPECT_TRUE(contains(error_of("{{ 'x' * 10 ** 12 }}"), "larger than"));
  EXPECT_TRUE(contains(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), "nested deeper"));
  // Deep chains built through a namespace would overflow the stack when freed; they are refused when built.
  EXPECT_TRUE(contains(error_of("{% set ns = namespace(v=0) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}"
                                "{% endfor %}"),
                       "nested deeper"));
  EXPECT_TRUE(contains(error_of("{% set ns = namespace(v=[]) %}{% for i in range(100000) %}"
                                "{% set ns.v = {'k': ns.v.copy} %}{% endfor %}"),
                       "nested deeper"));
  EXPECT_TRUE(contains(error_of("{% set ns = namespace(v=0) %}{% for i in range(100000) %}{% for x in [ns.v, 0] %}"
                                "{% set ns.v = [loop] %}{% endfor %}{% endfor %}"),
                       "nested deeper"));
  // A long chain of namespaces is fine: namespaces are released one by one.
  EXPECT_EQ(
      render("{% set h = namespace(cur=namespace()) %}{% set head = h.cur %}{% for i in range(100000) %}"
             "{% set n = namespace() %}{% set cur = h.cur %}{% set cur.next = n %}{% set h.cur = n %}{% endfor %}ok"),
      "ok");
}

TEST(Jinja, ContextFromJson) {
  nlohmann::json sorted = {{"b", 1}, {"a", 2}};
  EXPECT_EQ(Template("{{ d | tojson }}").render(nlohmann::json{{"d", sorted}}), R"({"a": 2, "b": 1})");
  ojson ordered = ojson::parse(R"({"b": 1, "a": 2})");
  EXPECT_EQ(Template("{{ d | tojson }}").render(ojson{{"d", ordered}}), R"({"b": 1, "a": 2})");
  EXPECT_EQ(Template("{{ big }} {{ f }} {{ n }}")
                .render(ojson::parse(R"({"big": 18446744073709551615, "f": 1.0, "n": null})")),
            "1.8446744073709552e+19 1.0 None");
  EXPECT_THROW(Template("x").render(ojson::array({1})), Error);
  // A template can be rendered many times and from copies.
  Template t("{{ v }}");
  Template copy = t;
  EXPECT_EQ(t.render(ojson{{"v", 1}}), "1");
  EXPECT_EQ(copy.render(ojson{{"v", 2}}), "2");
}

}  // namespace
}  // namespace moecel::jinja
