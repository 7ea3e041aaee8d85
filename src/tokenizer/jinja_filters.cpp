// Jinja filters, with jinja2's signatures and Python's behaviour (`tojson` is the transformers override:
// json.dumps with ensure_ascii=False). select/map/reverse/unique/items return Value::generator, like jinja2's
// lazy results. Also the argument binder and attribute paths that filters, tests and methods share.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"

namespace moecel::jinja {
namespace {

bool given(const Value& v) {
  return !v.is_undefined();
}

int64_t int_arg(const Value& v, std::string_view fn, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) fail("{}(): '{}' must be an integer, got {}", fn, what, type_name(v));
  return v.get_int();
}

std::string str_arg(const Value& v, std::string_view fn, std::string_view what) {
  if (!v.is_string()) fail("{}(): '{}' must be a string, got {}", fn, what, type_name(v));
  return v.str();
}

size_t py_len(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined: return 0;
    case Value::Type::kString: return text::length(v.str());
    case Value::Type::kList:
      if (v.is_generator()) fail("object of type 'generator' has no len()");
      return v.items().size();
    case Value::Type::kDict: return v.as_dict().items.size();
    default: fail("object of type '{}' has no len()", type_name(v));
  }
}

// Sort key for case-insensitive comparisons, like jinja2's ignore_case().
Value fold(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(text::lower(v.str())) : v;
}

Value keyed(Interp& in, const Value& item, const Value& attribute, bool case_sensitive) {
  Value v = given(attribute) && !attribute.is_none() ? get_path(in, item, to_str(attribute)) : item;
  return fold(v, case_sensitive);
}

std::vector<Value> sorted(Interp& in, std::vector<Value> items, bool reverse, bool case_sensitive,
                          const Value& attribute) {
  std::vector<std::pair<Value, Value>> pairs;
  for (Value& v : items) pairs.emplace_back(keyed(in, v, attribute, case_sensitive), std::move(v));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const auto& a, const auto& b) {
    return reverse ? compare(b.first, a.first) < 0 : compare(a.first, b.first) < 0;
  });
  std::vector<Value> out;
  for (auto& p : pairs) out.push_back(std::move(p.second));
  return out;
}

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  bind_args("abs", a, {});
  if (v.is_float()) return Value::real(std::fabs(v.as_double()));
  if (v.is_number()) return Value::integer(std::llabs(v.get_int()));
  fail("bad operand type for abs(): '{}'", type_name(v));
}

Value f_attr(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind_args("attr", a, {"name"}, 1);
  std::string name = str_arg(p[0], "attr", "name");
  Value m;
  if (v.is_namespace()) return in.get_attr(v, name);
  if (get_method(v, name, &m)) return m;
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", type_name(v), name));
}

Value f_capitalize(Interp&, const Value& v, CallArgs& a) {
  bind_args("capitalize", a, {});
  return Value::string(text::capitalize(to_str(v)));
}

Value f_center(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("center", a, {"width"});
  std::string s = to_str(v);
  int64_t width = given(p[0]) ? int_arg(p[0], "center", "width") : 80;
  int64_t len = static_cast<int64_t>(text::length(s));
  if (width <= len) return Value::string(s);
  Interp::check_size(static_cast<size_t>(width));
  int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
  return Value::string(std::string(left, ' ') + s + std::string(marg - left, ' '));
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("default", a, {"default_value", "boolean"});
  bool boolean = given(p[1]) && truthy(p[1]);
  if (v.is_undefined() || (boolean && !truthy(v))) return given(p[0]) ? p[0] : Value::string("");
  return v;
}

Value f_dictsort(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) fail("dictsort(): expected a dict, got {}", type_name(v));
  bool cs = given(p[0]) && truthy(p[0]);
  std::string by = given(p[1]) ? str_arg(p[1], "dictsort", "by") : "key";
  if (by != "key" && by != "value") fail("dictsort(): 'by' must be 'key' or 'value'");
  std::vector<Value> items;
  for (const auto& [k, val] : v.as_dict().items) items.push_back(Value::list({Value::string(k), val}, true));
  bool rev = given(p[2]) && truthy(p[2]);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    size_t i = by == "key" ? 0 : 1;
    int c = compare(fold(x.items()[i], cs), fold(y.items()[i], cs));
    return rev ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value f_escape(Interp&, const Value& v, CallArgs& a) {
  bind_args("escape", a, {});
  return Value::string(text::html_escape(to_str(v)));
}

Value f_first(Interp&, const Value& v, CallArgs& a) {
  bind_args("first", a, {});
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interp&, const Value& v, CallArgs& a) {
  bind_args("last", a, {});
  if (v.is_generator()) fail("'generator' object is not reversible");
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// Python float(str): optional whitespace, sign, digits with single underscores, inf/nan.
bool parse_float(const std::string& s, double* out) {
  std::string t = text::strip(s, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      if (i == 0 || i + 1 == t.size() || !std::isdigit((unsigned char)t[i - 1]) ||
          !std::isdigit((unsigned char)t[i + 1]))
        return false;
      continue;
    }
    clean.push_back(t[i]);
  }
  if (clean.empty()) return false;
  std::string low = text::lower(clean);
  size_t sign = (low[0] == '+' || low[0] == '-') ? 1 : 0;
  std::string body = low.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = body == "nan" ? NAN : (low[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  if (body.empty() || !(std::isdigit((unsigned char)body[0]) || body[0] == '.')) return false;
  if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end && *end == '\0';
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("float", a, {"default"});
  Value def = given(p[0]) ? p[0] : Value::real(0.0);
  if (v.is_undefined()) undefined_error(v);  // float(Undefined) raises in jinja2
  if (v.is_number()) return Value::real(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.str(), &d)) return Value::real(d);
  return def;
}

Value f_format(Interp&, const Value& v, CallArgs& a) {
  if (!a.kwargs.empty() && !a.args.empty()) fail("format(): can't handle positional and keyword arguments at once");
  if (!a.kwargs.empty()) {
    Dict d;
    for (auto& [k, val] : a.kwargs) d.set(k, val);
    return Value::string(python_percent_format(to_str(v), Value::dict(std::move(d))));
  }
  return Value::string(python_percent_format(to_str(v), Value::list(a.args, true)));
}

Value f_indent(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("indent", a, {"width", "first", "blank"});
  std::string ind = !given(p[0])       ? "    "
                    : p[0].is_string() ? p[0].str()
                                       : std::string(std::max<int64_t>(0, int_arg(p[0], "indent", "width")), ' ');
  if (!v.is_string()) fail("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v));
  std::string s = v.str() + "\n";  // jinja2 appends a newline so that splitlines() sees the last line
  std::vector<std::string> lines = text::splitlines(s, false);
  std::string rv;
  if (given(p[2]) && truthy(p[2])) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  if (given(p[1]) && truthy(p[1])) rv = ind + rv;
  Interp::check_size(rv.size());
  return Value::string(rv);
}

// Python int(str, base) for base 10 (whitespace, sign, single underscores between digits).
bool parse_int(const std::string& s, int64_t base, int64_t* out) {
  std::string t = text::strip(s, nullptr, true, true);
  size_t i = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
  std::string digits;
  for (size_t k = i; k < t.size(); ++k) {
    if (t[k] == '_' && k > i && k + 1 < t.size() && t[k - 1] != '_') continue;
    digits.push_back(t[k]);
  }
  if (digits.empty() || base < 2 || base > 36) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (*end != '\0' || errno == ERANGE || !std::isalnum((unsigned char)digits[0])) return false;
  *out = (i && t[0] == '-') ? -v : v;
  return true;
}

// A finite double truncated to int64; outside that range the cast would be undefined behaviour (jinja2 would
// give a Python big integer), so it is an error.
int64_t truncate_to_int(double d) {
  const double t = std::trunc(d);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) {
    fail("int: {} is outside the 64-bit integer range (Python integers are unbounded, this engine uses 64 bits)",
         float_repr(d));
  }
  return static_cast<int64_t>(t);
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("int", a, {"default", "base"});
  Value def = given(p[0]) ? p[0] : Value::integer(0);
  int64_t base = given(p[1]) ? int_arg(p[1], "int", "base") : 10;
  if (v.is_undefined()) undefined_error(v);  // int(Undefined) raises in jinja2
  if (v.is_float()) {
    double d = v.as_double();
    if (std::isnan(d) || std::isinf(d)) fail("cannot convert float {} to integer", float_repr(d));
    return Value::integer(truncate_to_int(d));
  }
  if (v.is_number()) return Value::integer(v.get_int());
  int64_t i;
  double d;
  if (v.is_string() && parse_int(v.str(), base, &i)) return Value::integer(i);
  if (v.is_string() && parse_float(v.str(), &d) && std::isfinite(d)) return Value::integer(truncate_to_int(d));
  return def;
}

Value f_items(Interp&, const Value& v, CallArgs& a) {
  bind_args("items", a, {});
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::list({Value::string(k), val}, true));
  return Value::generator(std::move(out));
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind_args("join", a, {"d", "attribute"});
  std::string sep = given(p[0]) ? to_str(p[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(given(p[1]) && !p[1].is_none() ? get_path(in, item, to_str(p[1])) : item);
    Interp::check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  bind_args("length", a, {});
  return Value::integer(static_cast<int64_t>(py_len(v)));
}

Value f_list(Interp&, const Value& v, CallArgs& a) {
  bind_args("list", a, {});
  return Value::list(iterate(v));
}

Value f_lower(Interp&, const Value& v, CallArgs& a) {
  bind_args("lower", a, {});
  return Value::string(text::lower(to_str(v)));
}

Value f_upper(Interp&, const Value& v, CallArgs& a) {
  bind_args("upper", a, {});
  return Value::string(text::upper(to_str(v)));
}

Value f_title(Interp&, const Value& v, CallArgs& a) {
  bind_args("title", a, {});
  return Value::string(text::title_filter(to_str(v)));
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* def = nullptr;
  for (const auto& [k, val] : a.kwargs) {
    if (k == "attribute")
      attribute = &val;
    else if (k == "default")
      def = &val;
    else if (a.args.empty())
      fail("map(): unexpected keyword argument '{}'", k);
  }
  if (attribute) {
    for (const Value& item : iterate(v)) {
      Value r = get_path(in, item, to_str(*attribute));
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return Value::generator(std::move(out));
  }
  if (a.args.empty()) fail("map requires a filter argument");
  std::string name = str_arg(a.args[0], "map", "filter");
  CallArgs rest{std::vector<Value>(a.args.begin() + 1, a.args.end()), a.kwargs};
  for (const Value& item : iterate(v)) {
    CallArgs call = rest;
    out.push_back(in.apply_filter(name, item, call));
  }
  return Value::generator(std::move(out));
}

Value min_max(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  auto p = bind_args(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  bool cs = given(p[0]) && truthy(p[0]);
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare(keyed(in, items[i], p[1], cs), keyed(in, items[best], p[1], cs));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, CallArgs& a) {
  return min_max(in, v, a, true);
}
Value f_min(Interp& in, const Value& v, CallArgs& a) {
  return min_max(in, v, a, false);
}

// select / reject / selectattr / rejectattr
Value select_impl(Interp& in, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  std::vector<Value> args = a.args;
  std::string attr;
  if (by_attr) {
    if (args.empty()) fail("selectattr/rejectattr need an attribute name");
    attr = to_str(args[0]);
    args.erase(args.begin());
  }
  std::string test;
  if (!args.empty()) {
    test = str_arg(args[0], "select", "test");
    args.erase(args.begin());
  }
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value x = by_attr ? get_path(in, item, attr) : item;
    bool r;
    if (test.empty()) {
      r = truthy(x);
    } else {
      CallArgs targs{args, a.kwargs};
      r = in.apply_test(test, x, targs);
    }
    if (r == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}
Value f_select(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, true);
}
Value f_reject(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, false);
}
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, false);
}

Value f_replace(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("replace", a, {"old", "new", "count"}, 2);
  int64_t count = given(p[2]) && !p[2].is_none() ? int_arg(p[2], "replace", "count") : -1;
  std::string r = text::replace(to_str(v), to_str(p[0]), to_str(p[1]), count);
  Interp::check_size(r.size());
  return Value::string(std::move(r));
}

Value f_reverse(Interp&, const Value& v, CallArgs& a) {
  bind_args("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = text::decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(text::encode(u));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  // reversed() gives an iterator; a generator is not reversible, so jinja2 falls back to a reversed list
  return v.is_generator() ? Value::list(std::move(items)) : Value::generator(std::move(items));
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("round", a, {"precision", "method"});
  int64_t prec = given(p[0]) ? int_arg(p[0], "round", "precision") : 0;
  std::string method = given(p[1]) ? str_arg(p[1], "round", "method") : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("round(): method must be 'common', 'ceil' or 'floor'");
  if (!v.is_number()) fail("type {} doesn't define __round__ method", type_name(v));
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.get_int());
    double d = v.as_double();
    if (!std::isfinite(d) || prec > 300) return Value::real(d);
    if (prec < 0) {  // rounds to tens, hundreds, ...
      double scale = std::pow(10.0, static_cast<double>(-prec));
      return Value::real(std::nearbyint(d / scale) * scale);
    }
    // printf rounds the exact binary value half-to-even, which is what Python's round() does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(prec), d);
    return Value::real(std::strtod(buf, nullptr));
  }
  double scale = std::pow(10.0, static_cast<double>(prec));
  double x = v.as_double() * scale;
  return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interp&, const Value& v, CallArgs& a) {
  bind_args("safe", a, {});
  return v;
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind_args("sort", a, {"reverse", "case_sensitive", "attribute"});
  return Value::list(sorted(in, iterate(v), given(p[0]) && truthy(p[0]), given(p[1]) && truthy(p[1]), p[2]));
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  bind_args("string", a, {});
  return Value::string(to_str(v));
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind_args("sum", a, {"attribute", "start"});
  Value total = given(p[1]) ? p[1] : Value::integer(0);
  for (const Value& item : iterate(v)) {
    Value x = given(p[0]) && !p[0].is_none() ? get_path(in, item, to_str(p[0])) : item;
    if (!total.is_number() || !x.is_number())
      fail("unsupported operand type(s) for +: '{}' and '{}'", type_name(total), type_name(x));
    if (total.is_float() || x.is_float())
      total = Value::real(total.as_double() + x.as_double());
    else
      total = Value::integer(total.get_int() + x.get_int());
  }
  return total;
}

Value f_tojson(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = given(p[0]) && truthy(p[0]);
  if (given(p[1]) && !p[1].is_none()) {
    o.has_indent = true;
    o.indent =
        p[1].is_string() ? p[1].str() : std::string(std::max<int64_t>(0, int_arg(p[1], "tojson", "indent")), ' ');
    o.item_sep = ",";
  }
  if (given(p[2]) && !p[2].is_none()) {
    if (!p[2].is_list() || p[2].items().size() != 2 || !p[2].items()[0].is_string() || !p[2].items()[1].is_string())
      fail("tojson(): separators must be a pair of strings");
    o.item_sep = p[2].items()[0].str();
    o.key_sep = p[2].items()[1].str();
  }
  o.sort_keys = given(p[3]) && truthy(p[3]);
  std::string s = dumps(v, o);
  Interp::check_size(s.size());
  return Value::string(std::move(s));
}

Value f_trim(Interp&, const Value& v, CallArgs& a) {
  auto p = bind_args("trim", a, {"chars"});
  std::string chars = given(p[0]) && !p[0].is_none() ? to_str(p[0]) : "";
  return Value::string(text::strip(to_str(v), given(p[0]) && !p[0].is_none() ? &chars : nullptr, true, true));
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  auto p = bind_args("unique", a, {"case_sensitive", "attribute"});
  bool cs = given(p[0]) && truthy(p[0]);
  std::vector<Value> out, seen;
  for (const Value& item : iterate(v)) {
    Value k = keyed(in, item, p[1], cs);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  bind_args("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : text::decode(to_str(v))) {
    bool w = text::cp_is_alnum(c) || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};
// clang-format off
const FilterEntry kFilters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
    {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape},
    {"first", f_first}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
    {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
    {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
    {"upper", f_upper}, {"wordcount", f_wordcount},
};
// clang-format on

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters)
    if (name == f.name) return f.fn;
  return nullptr;
}

bool is_unsupported_filter(std::string_view name) {
  static const char* kLeftOut[] = {"batch",     "filesizeformat", "groupby",   "pprint", "random",   "slice",
                                   "striptags", "truncate",       "urlencode", "urlize", "wordwrap", "xmlattr"};
  return std::any_of(std::begin(kLeftOut), std::end(kLeftOut), [&](const char* n) { return name == n; });
}

std::vector<Value> bind_args(std::string_view fn, const CallArgs& a, std::initializer_list<const char*> params,
                             size_t n_required) {
  std::vector<Value> out(params.size());
  std::vector<bool> set(params.size(), false);
  if (a.args.size() > params.size())
    fail("{}() takes at most {} argument(s) ({} given)", fn, params.size(), a.args.size());
  for (size_t i = 0; i < a.args.size(); ++i) {
    out[i] = a.args[i];
    set[i] = true;
  }
  for (const auto& [k, v] : a.kwargs) {
    size_t i = 0;
    for (const char* p : params) {
      if (k == p) break;
      ++i;
    }
    if (i == params.size()) fail("{}() got an unexpected keyword argument '{}'", fn, k);
    if (set[i]) fail("{}() got multiple values for argument '{}'", fn, k);
    out[i] = v;
    set[i] = true;
  }
  for (size_t i = 0; i < n_required; ++i)
    if (!set[i]) fail("{}() missing required argument '{}'", fn, *(params.begin() + i));
  return out;
}

Value get_path(Interp& in, const Value& obj, const std::string& path) {
  Value v = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && part.size() < 19 &&
                   std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = in.get_item(v, numeric ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

}  // namespace moecel::jinja
