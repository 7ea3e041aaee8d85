// Values of the Jinja engine: Python's data model as chat templates see it (undefined, None, bool, int,
// float, str, list/tuple, dict, namespace, callable), with Python's str()/repr(), ==, <, truthiness and
// json.dumps formatting, so renders match jinja2 byte for byte. Lists, dicts and namespaces are shared by
// reference like Python objects; only namespaces are mutable (the sandbox freezes lists and dicts).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moecel::jinja {

class Interp;
class Value;

// Thrown by a template's raise_exception(msg); what() is exactly the template's message.
class RaisedError : public Error {
 public:
  using Error::Error;
};

// An error that already names its template line ("template line N: ...").
class LocatedError : public Error {
 public:
  using Error::Error;
};

struct Array;
struct Dict;
struct Function;

class Value {
 public:
  enum class Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value real(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items, bool tuple = false);
  // What jinja2's select/map/reverse/unique/items filters return: a one-shot generator. It iterates like a
  // list but is always true, has no len(), cannot be indexed, compared or serialised. (Unlike Python's, it
  // can be iterated more than once.)
  static Value generator(std::vector<Value> items);
  static Value dict(Dict d);
  static Value namespace_(Dict attrs);
  // `depth`: 1 + the depth of what the function holds on to (a bound method's object), see depth().
  static Value function(std::string name, std::function<Value(Interp&, struct CallArgs&)> fn, int depth = 1);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat || type_ == Type::kBool; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }  // list, tuple or generator
  bool is_tuple() const;
  bool is_generator() const;
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_namespace() const { return type_ == Type::kNamespace; }
  bool is_function() const { return type_ == Type::kFunction; }

  bool get_bool() const { return b_; }
  int64_t get_int() const { return type_ == Type::kBool ? int64_t(b_) : i_; }  // bools are ints in Python
  double as_double() const;                                                    // any number
  const std::string& str() const { return s_; }  // the string, or an undefined value's hint
  const std::vector<Value>& items() const;       // list/tuple items
  const Dict& as_dict() const;                   // dict or namespace attributes
  Dict& mutable_dict() const;  // namespace attributes, and the loop object the evaluator updates in place
  const Function& fn() const { return *fn_; }
  bool same_object(const Value& o) const;  // Python `is`
  // Nesting of lists/dicts/bound methods (0 for scalars). Bounded by kMaxValueDepth when a value is built, so
  // that destroying, printing or comparing it cannot exhaust the stack. Namespaces count as leaves: the
  // interpreter keeps every namespace alive until a render ends, so releasing one never cascades.
  int depth() const { return depth_; }
  // For a container that is updated in place (the loop object): a copy whose depth() is at least `depth`.
  Value with_depth_bound(int depth) const;

  // Conversion from JSON (either nlohmann flavour); object key order is kept as given.
  template <class Json>
  static Value from_json(const Json& j, int depth = 0);

 private:
  Type type_ = Type::kUndefined;
  int depth_ = 0;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<Array> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

struct Array {
  std::vector<Value> items;
  bool tuple = false;
  bool generator = false;
};

// Insertion-ordered string-keyed mapping (Python dicts keep insertion order; json.dumps and repr show it).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);  // replaces in place or appends
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

struct Function {
  std::string name;
  std::function<Value(Interp&, CallArgs&)> call;
};

// Python semantics
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); undefined renders as ""
std::string repr(const Value& v);
std::string float_repr(double d);       // repr(float): shortest round-trip digits, Python's layout
std::string type_name(const Value& v);  // 'str', 'int', 'NoneType', ... for error messages
bool equals(const Value& a, const Value& b);
// Python's a < b (-1), a == b (0), a > b (1) for numbers, strings and same-kind sequences; throws Error
// "'<' not supported between instances of 'str' and 'int'" otherwise.
int compare(const Value& a, const Value& b, std::string_view op = "<");
// Python's `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
// Items of a for-loop / list(): list items, dict keys, string characters, nothing for undefined.
std::vector<Value> iterate(const Value& v);
// A bound undefined value's error: "'x' is undefined".
[[noreturn]] void undefined_error(const Value& v);

struct JsonOptions {
  bool ensure_ascii = false;
  std::string indent;  // used only when has_indent
  bool has_indent = false;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string dumps(const Value& v, const JsonOptions& opt);  // Python json.dumps

// Deeper values are refused so that printing or comparing them cannot exhaust the stack.
inline constexpr int kMaxValueDepth = 128;

template <class Json>
Value Value::from_json(const Json& j, int depth) {
  MOECEL_CHECK(depth < kMaxValueDepth, "template data: JSON nested deeper than {} levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? real(static_cast<double>(u)) : integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return real(j.template get<double>());
    case nlohmann::json::value_t::string: return string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), from_json(it.value(), depth + 1));
      return dict(std::move(d));
    }
    default: fail("template data: unsupported JSON value of type {}", j.type_name());
  }
}

}  // namespace moecel::jinja
