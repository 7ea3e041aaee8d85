// Methods of str/dict/list values that chat templates call (message.content.startswith(...),
// messages[0].get('x'), ...), Python's `%` string formatting, and the globals transformers defines.
// Mutating methods are refused like jinja2's ImmutableSandboxedEnvironment does.
#include <fmt/printf.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"

namespace moecel::jinja {
namespace {

using Method = Value (*)(const Value& self, const CallArgs& a);

bool given(const Value& v) {
  return !v.is_undefined() && !v.is_none();
}

std::string want_str(const Value& v, std::string_view fn) {
  if (!v.is_string()) fail("{}() argument must be str, not {}", fn, type_name(v));
  return v.str();
}

int64_t want_int(const Value& v, std::string_view fn) {
  if (!v.is_int() && !v.is_bool()) fail("{}() argument must be an integer, not {}", fn, type_name(v));
  return v.get_int();
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

Value affix(const Value& self, const CallArgs& a, bool prefix) {
  const char* fn = prefix ? "startswith" : "endswith";
  auto p = bind_args(fn, a, {"prefix"}, 1);
  auto test = [&](const std::string& x) {
    const std::string& s = self.str();
    return x.size() <= s.size() &&
           (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (p[0].is_string()) return Value::boolean(test(p[0].str()));
  if (p[0].is_tuple()) {
    for (const Value& x : p[0].items())
      if (test(want_str(x, fn))) return Value::boolean(true);
    return Value::boolean(false);
  }
  fail("{} first arg must be str or a tuple of str, not {}", fn, type_name(p[0]));
}
Value m_startswith(const Value& s, const CallArgs& a) {
  return affix(s, a, true);
}
Value m_endswith(const Value& s, const CallArgs& a) {
  return affix(s, a, false);
}

Value strip_impl(const Value& self, const CallArgs& a, const char* fn, bool left, bool right) {
  auto p = bind_args(fn, a, {"chars"});
  std::string chars = given(p[0]) ? want_str(p[0], fn) : "";
  return Value::string(text::strip(self.str(), given(p[0]) ? &chars : nullptr, left, right));
}
Value m_strip(const Value& s, const CallArgs& a) {
  return strip_impl(s, a, "strip", true, true);
}
Value m_lstrip(const Value& s, const CallArgs& a) {
  return strip_impl(s, a, "lstrip", true, false);
}
Value m_rstrip(const Value& s, const CallArgs& a) {
  return strip_impl(s, a, "rstrip", false, true);
}

Value split_impl(const Value& self, const CallArgs& a, bool right) {
  const char* fn = right ? "rsplit" : "split";
  auto p = bind_args(fn, a, {"sep", "maxsplit"});
  std::string sep = given(p[0]) ? want_str(p[0], fn) : "";
  if (given(p[0]) && sep.empty()) fail("empty separator");
  int64_t maxsplit = given(p[1]) ? want_int(p[1], fn) : -1;
  const std::string* sp = given(p[0]) ? &sep : nullptr;
  return str_list(right ? text::rsplit(self.str(), sp, maxsplit) : text::split(self.str(), sp, maxsplit));
}
Value m_split(const Value& s, const CallArgs& a) {
  return split_impl(s, a, false);
}
Value m_rsplit(const Value& s, const CallArgs& a) {
  return split_impl(s, a, true);
}

Value m_splitlines(const Value& s, const CallArgs& a) {
  auto p = bind_args("splitlines", a, {"keepends"});
  return str_list(text::splitlines(s.str(), given(p[0]) && truthy(p[0])));
}

Value m_replace(const Value& s, const CallArgs& a) {
  auto p = bind_args("replace", a, {"old", "new", "count"}, 2);
  std::string r = text::replace(s.str(), want_str(p[0], "replace"), want_str(p[1], "replace"),
                                given(p[2]) ? want_int(p[2], "replace") : -1);
  Interp::check_size(r.size());
  return Value::string(std::move(r));
}

Value m_upper(const Value& s, const CallArgs& a) {
  return bind_args("upper", a, {}), Value::string(text::upper(s.str()));
}
Value m_lower(const Value& s, const CallArgs& a) {
  return bind_args("lower", a, {}), Value::string(text::lower(s.str()));
}
Value m_title(const Value& s, const CallArgs& a) {
  return bind_args("title", a, {}), Value::string(text::title_method(s.str()));
}
Value m_capitalize(const Value& s, const CallArgs& a) {
  return bind_args("capitalize", a, {}), Value::string(text::capitalize(s.str()));
}

Value find_impl(const Value& self, const CallArgs& a, const char* fn, bool reverse, bool raise) {
  auto p = bind_args(fn, a, {"sub"}, 1);
  std::string sub = want_str(p[0], fn);
  size_t f = reverse ? self.str().rfind(sub) : self.str().find(sub);
  if (f == std::string::npos) {
    if (raise) fail("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(static_cast<int64_t>(text::cp_index(self.str(), f)));
}
Value m_find(const Value& s, const CallArgs& a) {
  return find_impl(s, a, "find", false, false);
}
Value m_rfind(const Value& s, const CallArgs& a) {
  return find_impl(s, a, "rfind", true, false);
}
Value m_index(const Value& s, const CallArgs& a) {
  return find_impl(s, a, "index", false, true);
}
Value m_rindex(const Value& s, const CallArgs& a) {
  return find_impl(s, a, "rindex", true, true);
}

Value m_count(const Value& self, const CallArgs& a) {
  auto p = bind_args("count", a, {"x"}, 1);
  if (self.is_list()) {
    return Value::integer(
        std::count_if(self.items().begin(), self.items().end(), [&](const Value& v) { return equals(v, p[0]); }));
  }
  std::string sub = want_str(p[0], "count");
  if (sub.empty()) return Value::integer(static_cast<int64_t>(text::length(self.str()) + 1));
  int64_t n = 0;
  for (size_t pos = self.str().find(sub); pos != std::string::npos; pos = self.str().find(sub, pos + sub.size())) ++n;
  return Value::integer(n);
}

Value m_join(const Value& self, const CallArgs& a) {
  auto p = bind_args("join", a, {"iterable"}, 1);
  std::string out;
  bool first = true;
  for (const Value& v : iterate(p[0])) {
    if (!v.is_string()) fail("sequence item: expected str instance, {} found", type_name(v));
    if (!first) out += self.str();
    first = false;
    out += v.str();
    Interp::check_size(out.size());
  }
  return Value::string(std::move(out));
}

template <bool (*Pred)(char32_t)>
Value m_is(const Value& s, const CallArgs& a) {
  bind_args("is", a, {});
  return Value::boolean(text::all_chars(s.str(), Pred));
}
bool space_pred(char32_t c) {
  return text::is_space(c);
}
Value m_islower(const Value& s, const CallArgs& a) {
  return bind_args("islower", a, {}), Value::boolean(text::has_cased(s.str(), false));
}
Value m_isupper(const Value& s, const CallArgs& a) {
  return bind_args("isupper", a, {}), Value::boolean(text::has_cased(s.str(), true));
}

Value pad_impl(const Value& self, const CallArgs& a, const char* fn, int where) {
  auto p = bind_args(fn, a, {"width", "fillchar"}, 1);
  int64_t width = want_int(p[0], fn);
  std::string fill = given(p[1]) ? want_str(p[1], fn) : " ";
  if (text::length(fill) != 1) fail("The fill character must be exactly one character long");
  int64_t len = static_cast<int64_t>(text::length(self.str()));
  if (width <= len) return self;
  Interp::check_size(static_cast<size_t>(width) * fill.size());
  int64_t marg = width - len;
  int64_t left = where < 0 ? 0 : where > 0 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += self.str();
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return Value::string(std::move(out));
}
Value m_center(const Value& s, const CallArgs& a) {
  return pad_impl(s, a, "center", 0);
}
Value m_ljust(const Value& s, const CallArgs& a) {
  return pad_impl(s, a, "ljust", -1);
}
Value m_rjust(const Value& s, const CallArgs& a) {
  return pad_impl(s, a, "rjust", 1);
}

Value m_items(const Value& self, const CallArgs& a) {
  bind_args("items", a, {});
  std::vector<Value> out;
  for (const auto& [k, v] : self.as_dict().items) out.push_back(Value::list({Value::string(k), v}, true));
  return Value::list(std::move(out));
}
Value m_keys(const Value& self, const CallArgs& a) {
  return bind_args("keys", a, {}), Value::list(iterate(self));
}
Value m_values(const Value& self, const CallArgs& a) {
  bind_args("values", a, {});
  std::vector<Value> out;
  for (const auto& kv : self.as_dict().items) out.push_back(kv.second);
  return Value::list(std::move(out));
}
Value m_get(const Value& self, const CallArgs& a) {
  auto p = bind_args("get", a, {"key", "default"}, 1);
  if (p[0].is_string())
    if (const Value* v = self.as_dict().find(p[0].str())) return *v;
  return p[1].is_undefined() ? Value::none() : p[1];
}
Value m_copy(const Value& self, const CallArgs& a) {
  bind_args("copy", a, {});
  return self.is_list() ? Value::list(self.items(), self.is_tuple()) : Value::dict(self.as_dict());
}
Value m_list_index(const Value& self, const CallArgs& a) {
  auto p = bind_args("index", a, {"x"}, 1);
  for (size_t i = 0; i < self.items().size(); ++i)
    if (equals(self.items()[i], p[0])) return Value::integer(static_cast<int64_t>(i));
  fail("{} is not in list", repr(p[0]));
}

struct MethodEntry {
  const char* name;
  Method fn;
};
const MethodEntry kStrMethods[] = {
    {"startswith", m_startswith},
    {"endswith", m_endswith},
    {"strip", m_strip},
    {"lstrip", m_lstrip},
    {"rstrip", m_rstrip},
    {"split", m_split},
    {"rsplit", m_rsplit},
    {"splitlines", m_splitlines},
    {"replace", m_replace},
    {"upper", m_upper},
    {"lower", m_lower},
    {"title", m_title},
    {"capitalize", m_capitalize},
    {"find", m_find},
    {"rfind", m_rfind},
    {"index", m_index},
    {"rindex", m_rindex},
    {"count", m_count},
    {"join", m_join},
    {"isdigit", m_is<text::cp_is_digit>},
    {"isnumeric", m_is<text::cp_is_digit>},
    {"isdecimal", m_is<text::cp_is_digit>},
    {"isalpha", m_is<text::cp_is_alpha>},
    {"isalnum", m_is<text::cp_is_alnum>},
    {"isspace", m_is<space_pred>},
    {"islower", m_islower},
    {"isupper", m_isupper},
    {"center", m_center},
    {"ljust", m_ljust},
    {"rjust", m_rjust},
};
const MethodEntry kDictMethods[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get}, {"copy", m_copy},
};
const MethodEntry kListMethods[] = {{"index", m_list_index}, {"count", m_count}, {"copy", m_copy}};

const char* const kMutatingList[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
const char* const kMutatingDict[] = {"update", "pop", "popitem", "setdefault", "clear"};

template <size_t N>
const MethodEntry* lookup(const MethodEntry (&table)[N], std::string_view name) {
  for (const auto& m : table)
    if (name == m.name) return &m;
  return nullptr;
}

template <size_t N>
bool listed(const char* const (&names)[N], std::string_view name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

// ---- globals ----

Value g_range(Interp& in, CallArgs& a) {
  auto p = bind_args("range", a, {"start", "stop", "step"}, 1);
  int64_t start = 0, stop, step = 1;
  if (p[1].is_undefined()) {
    stop = want_int(p[0], "range");
  } else {
    start = want_int(p[0], "range");
    stop = want_int(p[1], "range");
    if (!p[2].is_undefined()) step = want_int(p[2], "range");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  long double n = step > 0 ? std::ceil((static_cast<long double>(stop) - start) / step)
                           : std::ceil((static_cast<long double>(start) - stop) / -step);
  if (n > static_cast<long double>(kMaxRangeItems))
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRangeItems);
  std::vector<Value> out;
  if (n > 0) in.count_iterations(static_cast<size_t>(n));
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(i));
  return Value::list(std::move(out));
}

void check_ns_name(const std::string& k) {
  if (!k.empty() && k[0] == '_')
    fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'.", k);
}

Value g_namespace(Interp& in, CallArgs& a) {
  Dict attrs;
  if (a.args.size() > 1) fail("namespace() takes at most 1 positional argument");
  if (a.args.size() == 1) {
    if (!a.args[0].is_dict()) fail("namespace() positional argument must be a dict, got {}", type_name(a.args[0]));
    attrs = a.args[0].as_dict();
  }
  for (auto& [k, v] : a.kwargs) attrs.set(k, v);
  for (auto& kv : attrs.items) check_ns_name(kv.first);
  Value ns = Value::namespace_(std::move(attrs));
  in.track_namespace(ns);
  return ns;
}

Value g_dict(Interp&, CallArgs& a) {
  Dict d;
  if (a.args.size() > 1) fail("dict expected at most 1 argument, got {}", a.args.size());
  if (a.args.size() == 1) {
    const Value& src = a.args[0];
    if (src.is_dict()) {
      d = src.as_dict();
    } else {
      for (const Value& pair : iterate(src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) fail("dictionary update sequence element has length {}; 2 is required", kv.size());
        if (!kv[0].is_string()) fail("dict keys must be strings in this template engine, got {}", type_name(kv[0]));
        d.set(kv[0].str(), kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kwargs) d.set(k, v);
  return Value::dict(std::move(d));
}

Value g_raise_exception(Interp&, CallArgs& a) {
  auto p = bind_args("raise_exception", a, {"message"}, 1);
  throw RaisedError(to_str(p[0]));
}

Value g_strftime_now(Interp&, CallArgs& a) {
  auto p = bind_args("strftime_now", a, {"format"}, 1);
  std::string f = want_str(p[0], "strftime_now");
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::vector<char> buf(256 + f.size() * 16);
  size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
  if (n == 0 && !f.empty()) fail("strftime_now(): format '{}' produced no output", f);
  return Value::string(std::string(buf.data(), n));
}

}  // namespace

bool get_method(const Value& obj, std::string_view name, Value* out) {
  const MethodEntry* m = nullptr;
  if (obj.is_string()) {
    if (name == "format" || name == "format_map")
      fail("str.{}() is not supported in templates; use the '~' operator or the |format filter", name);
    m = lookup(kStrMethods, name);
  } else if (obj.is_dict()) {
    if (listed(kMutatingDict, name))
      fail("access to attribute '{}' of 'dict' object is unsafe (dicts are read-only)", name);
    m = lookup(kDictMethods, name);
  } else if (obj.is_list()) {
    if (listed(kMutatingList, name))
      fail("access to attribute '{}' of '{}' object is unsafe (lists are read-only)", name, type_name(obj));
    m = lookup(kListMethods, name);
  }
  if (!m) return false;
  Method fn = m->fn;
  Value self = obj;
  *out = Value::function(
      type_name(obj) + "." + m->name, [fn, self](Interp&, CallArgs& a) { return fn(self, a); }, obj.depth() + 1);
  return true;
}

void add_globals(Dict& g) {
  g.set("range", Value::function("range", g_range));
  g.set("namespace", Value::function("namespace", g_namespace));
  g.set("dict", Value::function("dict", g_dict));
  g.set("raise_exception", Value::function("raise_exception", g_raise_exception));
  g.set("strftime_now", Value::function("strftime_now", g_strftime_now));
}

std::string python_percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = args.is_dict() ? &args.as_dict() : nullptr;
  if (args.is_tuple())
    positional = args.items();
  else if (!mapping)
    positional.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (!mapping) fail("format requires a mapping");
      arg = mapping->find(fmt.substr(i + 1, close - i - 1));
      if (!arg) fail("KeyError: '{}'", fmt.substr(i + 1, close - i - 1));
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags += fmt[i++];
    int width = 0, prec = -1;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])))
      width = std::min(width * 10 + (fmt[i++] - '0'), 100000);
    if (i < fmt.size() && fmt[i] == '.') {
      prec = 0;
      ++i;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])))
        prec = std::min(prec * 10 + (fmt[i++] - '0'), 1000);
    }
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i];
    if (!arg) {
      if (mapping) fail("format requires a mapping");
      if (next >= positional.size()) fail("not enough arguments for format string");
      arg = &positional[next++];
    }
    std::string piece;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      piece = conv == 's' ? to_str(*arg) : repr(*arg);
      if (prec >= 0 && text::length(piece) > static_cast<size_t>(prec))
        piece = text::encode(text::decode(piece).substr(0, static_cast<size_t>(prec)));
    } else if (std::string_view("diouxXeEfFgGc").find(conv) != std::string_view::npos) {
      if (!arg->is_number()) fail("%{} format: a real number is required, not {}", conv, type_name(*arg));
      std::string spec = "%";
      for (char f : flags)
        if (f != '-' && f != '0') spec += f;  // padding is applied below
      if (prec >= 0) spec += fmt::format(".{}", prec);
      if (conv == 'c') {
        text::append_utf8(piece, static_cast<char32_t>(arg->get_int()));
      } else if (std::string_view("diouxX").find(conv) != std::string_view::npos) {
        long long v = arg->is_float() ? static_cast<long long>(std::trunc(arg->as_double())) : arg->get_int();
        bool neg_unsigned = v < 0 && (conv == 'o' || conv == 'x' || conv == 'X');  // Python prints -ff, not ff..01
        spec += conv == 'i' || conv == 'u' ? 'd' : conv;
        piece = fmt::sprintf(spec, neg_unsigned ? -v : v);
        if (neg_unsigned) piece.insert(piece.begin(), '-');
      } else {
        spec += conv;
        piece = fmt::sprintf(spec, arg->as_double());
      }
    } else {
      fail("unsupported format character '{}'", conv);
    }
    size_t len = text::length(piece);
    if (static_cast<size_t>(width) > len) {
      size_t pad = width - len;
      bool numeric = std::string_view("diouxXeEfFgG").find(conv) != std::string_view::npos;
      if (flags.find('-') != std::string::npos) {
        piece += std::string(pad, ' ');
      } else if (flags.find('0') != std::string::npos && numeric) {
        size_t sign = (!piece.empty() && (piece[0] == '-' || piece[0] == '+' || piece[0] == ' ')) ? 1 : 0;
        piece.insert(sign, std::string(pad, '0'));
      } else {
        piece.insert(0, std::string(pad, ' '));
      }
    }
    out += piece;
    Interp::check_size(out.size());
  }
  if (!mapping && next < positional.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace moecel::jinja
