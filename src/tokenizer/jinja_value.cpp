// Values of the Jinja engine: construction, Python's str()/repr()/==/</in semantics and json.dumps.
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "tokenizer/jinja_text.h"

namespace moecel::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.type_ = Type::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.i_ = i;
  return v;
}
Value Value::real(double d) {
  Value v;
  v.type_ = Type::kFloat;
  v.f_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.s_ = std::move(s);
  return v;
}
static int container_depth(int deepest_child) {
  MOECEL_CHECK(deepest_child < kMaxValueDepth, "value nested deeper than {} levels", kMaxValueDepth);
  return deepest_child + 1;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.type_ = Type::kList;
  int d = 0;
  for (const Value& item : items) d = std::max(d, item.depth_);
  v.depth_ = container_depth(d);
  v.list_ = std::make_shared<Array>(Array{std::move(items), tuple});
  return v;
}
Value Value::dict(Dict d) {
  Value v;
  v.type_ = Type::kDict;
  int deepest = 0;
  for (const auto& kv : d.items) deepest = std::max(deepest, kv.second.depth_);
  v.depth_ = container_depth(deepest);
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::namespace_(Dict attrs) {
  Value v = dict(std::move(attrs));
  v.type_ = Type::kNamespace;
  v.depth_ = 1;
  return v;
}
Value Value::function(std::string name, std::function<Value(Interp&, CallArgs&)> fn, int depth) {
  Value v;
  v.type_ = Type::kFunction;
  v.depth_ = container_depth(depth - 1);
  v.fn_ = std::make_shared<const Function>(Function{std::move(name), std::move(fn)});
  return v;
}

Value Value::with_depth_bound(int depth) const {
  Value v = *this;
  v.depth_ = std::max(depth_, container_depth(depth - 1));
  return v;
}

Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.list_->generator = true;
  return v;
}

bool Value::is_tuple() const {
  return type_ == Type::kList && list_->tuple;
}
bool Value::is_generator() const {
  return type_ == Type::kList && list_->generator;
}
double Value::as_double() const {
  return type_ == Type::kFloat ? f_ : static_cast<double>(get_int());
}
const std::vector<Value>& Value::items() const {
  return list_->items;
}
const Dict& Value::as_dict() const {
  return *dict_;
}
Dict& Value::mutable_dict() const {
  return *dict_;
}

bool Value::same_object(const Value& o) const {
  if (type_ != o.type_) return false;
  switch (type_) {
    case Type::kList: return list_ == o.list_;
    case Type::kDict:
    case Type::kNamespace: return dict_ == o.dict_;
    case Type::kFunction: return fn_ == o.fn_;
    default: return equals(*this, o);  // small ints, None, bools and interned strings behave like this
  }
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& kv : items)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return false;
    case Value::Type::kBool: return v.get_bool();
    case Value::Type::kInt: return v.get_int() != 0;
    case Value::Type::kFloat: return v.as_double() != 0.0;
    case Value::Type::kString: return !v.str().empty();
    case Value::Type::kList: return v.is_generator() || !v.items().empty();
    case Value::Type::kDict: return !v.as_dict().items.empty();
    default: return true;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);  // shortest round trip
  std::string s(buf, res.ptr);
  std::string out;
  if (s[0] == '-') {
    out = "-";
    s.erase(0, 1);
  }
  size_t e = s.find('e');
  int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits.push_back(s[i]);
  int decpt = exp + 1;  // digits before the decimal point
  int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {  // Python switches to exponent notation here
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    std::string es = std::to_string(std::abs(exp));
    out += std::string("e") + (exp < 0 ? "-" : "+") + (es.size() < 2 ? "0" : "") + es;
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(decpt - n, '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined: return "Undefined";
    case Value::Type::kNone: return "NoneType";
    case Value::Type::kBool: return "bool";
    case Value::Type::kInt: return "int";
    case Value::Type::kFloat: return "float";
    case Value::Type::kString: return "str";
    case Value::Type::kList: return v.is_generator() ? "generator" : v.is_tuple() ? "tuple" : "list";
    case Value::Type::kDict: return "dict";
    case Value::Type::kNamespace: return "Namespace";
    default: return "function";
  }
}

void undefined_error(const Value& v) {
  fail("{}", v.str().empty() ? std::string("undefined value") : v.str());
}

static void check_depth(int depth) {
  MOECEL_CHECK(depth < kMaxValueDepth, "value nested deeper than {} levels (a namespace containing itself?)",
               kMaxValueDepth);
}

static void write_repr(std::string& out, const Value& v, bool top, int depth) {
  check_depth(depth);
  switch (v.type()) {
    case Value::Type::kUndefined:
      if (!top) out += "Undefined";
      return;
    case Value::Type::kNone: out += "None"; return;
    case Value::Type::kBool: out += v.get_bool() ? "True" : "False"; return;
    case Value::Type::kInt: out += std::to_string(v.get_int()); return;
    case Value::Type::kFloat: out += float_repr(v.as_double()); return;
    case Value::Type::kString: out += top ? v.str() : text::repr(v.str()); return;
    case Value::Type::kList: {
      if (v.is_generator()) {
        out += "<generator object>";
        return;
      }
      out += v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += ", ";
        write_repr(out, v.items()[i], false, depth + 1);
      }
      if (v.is_tuple() && v.items().size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return;
    }
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      out += v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        out += text::repr(k) + ": ";
        write_repr(out, item, false, depth + 1);
      }
      out += v.is_namespace() ? "}>" : "}";
      return;
    }
    case Value::Type::kFunction: out += "<function " + v.fn().name + ">"; return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  write_repr(out, v, true, 0);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  write_repr(out, v, false, 0);
  return out;
}

static bool equals_impl(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.get_int() == b.get_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return true;
    case Value::Type::kString: return a.str() == b.str();
    case Value::Type::kList: {
      if (a.is_generator() || b.is_generator()) return a.same_object(b);
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equals_impl(a.items()[i], b.items()[i], depth + 1)) return false;
      return true;
    }
    case Value::Type::kDict: {
      const Dict& da = a.as_dict();
      const Dict& db = b.as_dict();
      if (da.items.size() != db.items.size()) return false;
      for (const auto& [k, item] : da.items) {
        const Value* other = db.find(k);
        if (!other || !equals_impl(item, *other, depth + 1)) return false;
      }
      return true;
    }
    default: return a.same_object(b);
  }
}

bool equals(const Value& a, const Value& b) {
  return equals_impl(a, b, 0);
}

static int compare_impl(const Value& a, const Value& b, std::string_view op, int depth) {
  check_depth(depth);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;  // NaN compares as equal-ish, like Python's False for both < and >
    }
    int64_t x = a.get_int(), y = b.get_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals_impl(x[i], y[i], depth + 1)) return compare_impl(x[i], y[i], op, depth + 1);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b));
}

int compare(const Value& a, const Value& b, std::string_view op) {
  return compare_impl(a, b, op, 0);
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.type()) {
    case Value::Type::kUndefined: return false;
    case Value::Type::kString:
      if (!needle.is_string()) fail("'in <string>' requires string as left operand, not {}", type_name(needle));
      return haystack.str().find(needle.str()) != std::string::npos;
    case Value::Type::kList:
      for (const Value& item : haystack.items())
        if (equals(item, needle)) return true;
      return false;
    case Value::Type::kDict: return needle.is_string() && haystack.as_dict().find(needle.str()) != nullptr;
    default: fail("argument of type '{}' is not iterable", type_name(haystack));
  }
}

std::vector<Value> iterate(const Value& v) {
  std::vector<Value> out;
  switch (v.type()) {
    case Value::Type::kUndefined: return out;
    case Value::Type::kList: return v.items();
    case Value::Type::kDict:
      out.reserve(v.as_dict().items.size());
      for (const auto& kv : v.as_dict().items) out.push_back(Value::string(kv.first));
      return out;
    case Value::Type::kString: {
      const std::string& s = v.str();
      if (text::is_ascii(s)) {
        for (char c : s) out.push_back(Value::string(std::string(1, c)));
      } else {
        for (char32_t c : text::decode(s)) {
          std::string ch;
          text::append_utf8(ch, c);
          out.push_back(Value::string(std::move(ch)));
        }
      }
      return out;
    }
    default: fail("'{}' object is not iterable", type_name(v));
  }
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  static const char* kHex = "0123456789abcdef";
  auto hex4 = [&](uint32_t c) {
    out += "\\u";
    for (int k = 3; k >= 0; --k) out.push_back(kHex[(c >> (4 * k)) & 0xF]);
  };
  out.push_back('"');
  if (!ensure_ascii) {
    for (char ch : s) {
      unsigned char c = static_cast<unsigned char>(ch);
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
            hex4(c);
          else
            out.push_back(ch);
      }
    }
  } else {
    for (char32_t c : text::decode(s)) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c >= 0x20 && c < 0x7F) {
            out.push_back(static_cast<char>(c));
          } else if (c < 0x10000) {
            hex4(c);
          } else {  // UTF-16 surrogate pair, as Python writes it
            uint32_t u = c - 0x10000;
            hex4(0xD800 + (u >> 10));
            hex4(0xDC00 + (u & 0x3FF));
          }
      }
    }
  }
  out.push_back('"');
}

static void dumps_impl(std::string& out, const Value& v, const JsonOptions& opt, int level) {
  check_depth(level);
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += opt.indent;
  };
  switch (v.type()) {
    case Value::Type::kNone: out += "null"; return;
    case Value::Type::kBool: out += v.get_bool() ? "true" : "false"; return;
    case Value::Type::kInt: out += std::to_string(v.get_int()); return;
    case Value::Type::kFloat: {
      double d = v.as_double();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(d);
      return;
    }
    case Value::Type::kString: json_string(out, v.str(), opt.ensure_ascii); return;
    case Value::Type::kList: {
      if (v.is_generator()) fail("Object of type generator is not JSON serializable");
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        dumps_impl(out, v.items()[i], opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Type::kDict: {
      const auto& items = v.as_dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& kv : items) order.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        json_string(out, order[i]->first, opt.ensure_ascii);
        out += opt.key_sep;
        dumps_impl(out, order[i]->second, opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out.push_back('}');
      return;
    }
    default: fail("Object of type {} is not JSON serializable", type_name(v));
  }
}

std::string dumps(const Value& v, const JsonOptions& opt) {
  std::string out;
  dumps_impl(out, v, opt, 0);
  return out;
}

}  // namespace moecel::jinja
