// Jinja tests (`x is defined`, `x is divisibleby 3`, `select('odd')`, ...) with jinja2's semantics; Python's
// bool counts as a number, as in jinja2.
#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"

namespace moecel::jinja {
namespace {

Value one_arg(const CallArgs& a, std::string_view test) {
  return bind_args(test, a, {"other"}, 1)[0];
}

bool t_defined(Interp&, const Value& v, CallArgs& a) {
  return bind_args("defined", a, {}), !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, CallArgs& a) {
  return bind_args("undefined", a, {}), v.is_undefined();
}
bool t_none(Interp&, const Value& v, CallArgs& a) {
  return bind_args("none", a, {}), v.is_none();
}
bool t_boolean(Interp&, const Value& v, CallArgs& a) {
  return bind_args("boolean", a, {}), v.is_bool();
}
bool t_true(Interp&, const Value& v, CallArgs& a) {
  return bind_args("true", a, {}), v.is_bool() && v.get_bool();
}
bool t_false(Interp&, const Value& v, CallArgs& a) {
  return bind_args("false", a, {}), v.is_bool() && !v.get_bool();
}
bool t_integer(Interp&, const Value& v, CallArgs& a) {
  return bind_args("integer", a, {}), v.is_int();
}
bool t_float(Interp&, const Value& v, CallArgs& a) {
  return bind_args("float", a, {}), v.is_float();
}
bool t_number(Interp&, const Value& v, CallArgs& a) {
  return bind_args("number", a, {}), v.is_number();
}
bool t_string(Interp&, const Value& v, CallArgs& a) {
  return bind_args("string", a, {}), v.is_string();
}
bool t_mapping(Interp&, const Value& v, CallArgs& a) {
  return bind_args("mapping", a, {}), v.is_dict();
}
bool t_iterable(Interp&, const Value& v, CallArgs& a) {
  bind_args("iterable", a, {});
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(Interp&, const Value& v, CallArgs& a) {
  return bind_args("callable", a, {}), v.is_function();
}
bool t_escaped(Interp&, const Value&, CallArgs& a) {
  return bind_args("escaped", a, {}), false;
}
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  return v.same_object(one_arg(a, "sameas"));
}
bool t_in(Interp&, const Value& v, CallArgs& a) {
  return contains(one_arg(a, "in"), v);
}
bool t_eq(Interp&, const Value& v, CallArgs& a) {
  return equals(v, one_arg(a, "eq"));
}
bool t_ne(Interp&, const Value& v, CallArgs& a) {
  return !equals(v, one_arg(a, "ne"));
}
bool t_lt(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "lt"), "<") < 0;
}
bool t_le(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "le"), "<=") <= 0;
}
bool t_gt(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "gt"), ">") > 0;
}
bool t_ge(Interp&, const Value& v, CallArgs& a) {
  return compare(v, one_arg(a, "ge"), ">=") >= 0;
}
bool t_lower(Interp&, const Value& v, CallArgs& a) {
  return bind_args("lower", a, {}), text::has_cased(to_str(v), false);
}
bool t_upper(Interp&, const Value& v, CallArgs& a) {
  return bind_args("upper", a, {}), text::has_cased(to_str(v), true);
}
bool t_sequence(Interp&, const Value& v, CallArgs& a) {
  bind_args("sequence", a, {});
  return v.is_undefined() || v.is_string() || (v.is_list() && !v.is_generator()) || v.is_dict();
}
bool divisible(const Value& v, const Value& n, std::string_view test) {
  if (!v.is_number() || !n.is_number())
    fail("{}: unsupported operand types '{}' and '{}'", test, type_name(v), type_name(n));
  if (v.is_float() || n.is_float()) {
    if (n.as_double() == 0.0) fail("float modulo");
    return std::fmod(v.as_double(), n.as_double()) == 0.0;
  }
  if (n.get_int() == 0) fail("integer division or modulo by zero");
  return v.get_int() % n.get_int() == 0;
}
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  return divisible(v, bind_args("divisibleby", a, {"num"}, 1)[0], "divisibleby");
}
bool t_even(Interp&, const Value& v, CallArgs& a) {
  return bind_args("even", a, {}), divisible(v, Value::integer(2), "even");
}
bool t_odd(Interp&, const Value& v, CallArgs& a) {
  return bind_args("odd", a, {}), !divisible(v, Value::integer(2), "odd");
}
bool t_filter(Interp&, const Value& v, CallArgs& a) {
  return bind_args("filter", a, {}), v.is_string() && find_filter(v.str());
}
bool t_test(Interp&, const Value& v, CallArgs& a) {
  return bind_args("test", a, {}), v.is_string() && find_test(v.str());
}

struct TestEntry {
  const char* name;
  TestFn fn;
};
// clang-format off
const TestEntry kTests[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean}, {"true", t_true},
    {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number}, {"string", t_string},
    {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence}, {"callable", t_callable},
    {"sameas", t_sameas}, {"escaped", t_escaped}, {"in", t_in}, {"odd", t_odd}, {"even", t_even},
    {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper}, {"eq", t_eq}, {"equalto", t_eq},
    {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le},
    {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"filter", t_filter},
    {"test", t_test},
};
// clang-format on

}  // namespace

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests)
    if (name == t.name) return t.fn;
  return nullptr;
}

bool is_unsupported_test(std::string_view) {
  return false;
}

}  // namespace moecel::jinja
