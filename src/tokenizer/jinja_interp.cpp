// Evaluator of parsed Jinja templates (see jinja_interp.h): statements, expressions and Python's operator
// semantics. Errors raised below a node without a line get that node's line attached on the way out.
#include "tokenizer/jinja_interp.h"

#include <cmath>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_text.h"

namespace moecel::jinja {
namespace {

struct DepthGuard {
  explicit DepthGuard(int& d) : d_(d) {
    if (++d_ > kMaxEvalDepth)
      fail("template recursion deeper than {} levels (a macro that calls itself without end?)", kMaxEvalDepth);
  }
  ~DepthGuard() { --d_; }
  int& d_;
};

[[noreturn]] void rethrow_at(int line, const Error& e) {
  throw LocatedError(fmt::format("template line {}: {}", line, e.what()));
}

void overflow_error() {
  fail("integer overflow (Python integers are unbounded, this engine uses 64 bits)");
}

// `op` is a __builtin_*_overflow; evaluated before the result is read.
template <class Op>
int64_t checked(Op op, int64_t x, int64_t y) {
  int64_t r;
  if (op(x, y, &r)) overflow_error();
  return r;
}
bool add_ov(int64_t x, int64_t y, int64_t* r) {
  return __builtin_add_overflow(x, y, r);
}
bool sub_ov(int64_t x, int64_t y, int64_t* r) {
  return __builtin_sub_overflow(x, y, r);
}
bool mul_ov(int64_t x, int64_t y, int64_t* r) {
  return __builtin_mul_overflow(x, y, r);
}

std::string object_desc(const Value& v) {
  return v.is_none() ? "None" : type_name(v) + " object";
}

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_desc(obj), name));
}

}  // namespace

Interp::Interp() {
  add_globals(globals_);
}

Interp::~Interp() {
  for (Value& ns : namespaces_) ns.mutable_dict().items.clear();
}

void Interp::check_size(size_t bytes) {
  if (bytes > kMaxStringBytes) fail("template output or string larger than {} MiB", kMaxStringBytes >> 20);
}

void Interp::count_iterations(size_t n) {
  iterations_ += n;
  if (iterations_ > kMaxLoopIterations) fail("template ran more than {} loop iterations", kMaxLoopIterations);
}

std::string Interp::render(const NodeList& nodes, const Value& context) {
  auto root = std::make_shared<Scope>();
  if (context.is_dict())
    for (const auto& [k, v] : context.as_dict().items) root->vars[k] = v;
  std::string out;
  exec(nodes, out, root);
  return out;
}

Value Interp::lookup(const std::string& name, const ScopePtr& scope) const {
  for (const Scope* s = scope.get(); s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* g = globals_.find(name)) return *g;
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

Interp::Flow Interp::exec(const NodeList& nodes, std::string& out, const ScopePtr& scope) {
  for (const NodePtr& n : nodes) {
    Flow f = exec_node(*n, out, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interp::Flow Interp::exec_node(const Node& n, std::string& out, const ScopePtr& scope) {
  DepthGuard guard(depth_);
  try {
    switch (n.kind) {
      case NodeKind::kText:
        out += n.text;
        check_size(out.size());
        return Flow::kNormal;
      case NodeKind::kOutput:
        out += to_str(eval(*n.expr, scope));
        check_size(out.size());
        return Flow::kNormal;
      case NodeKind::kIf:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond, scope))) return exec(body, out, scope);
        return Flow::kNormal;
      case NodeKind::kFor: return exec_for(n, out, scope);
      case NodeKind::kSet: assign(n.target, eval(*n.expr, scope), scope, n.line); return Flow::kNormal;
      case NodeKind::kSetBlock: {
        std::string body;
        // break/continue inside leave the loop at once, dropping the unfinished block, as in jinja2
        if (Flow f = exec(n.body, body, scope); f != Flow::kNormal) return f;
        assign(n.target, apply_filters(n.filters, Value::string(std::move(body)), scope), scope, n.line);
        return Flow::kNormal;
      }
      case NodeKind::kMacro: define_macro(n, scope); return Flow::kNormal;
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      case NodeKind::kFilterBlock: {
        std::string body;
        if (Flow f = exec(n.body, body, scope); f != Flow::kNormal) return f;
        out += to_str(apply_filters(n.filters, Value::string(std::move(body)), scope));
        check_size(out.size());
        return Flow::kNormal;
      }
      case NodeKind::kWith: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (const auto& [name, expr] : n.assigns) inner->vars[name] = eval(*expr, scope);
        return exec(n.body, out, inner);
      }
      case NodeKind::kGeneration: {
        auto inner = std::make_shared<Scope>();  // the body runs as a call block, in its own scope
        inner->parent = scope;
        return exec(n.body, out, inner);
      }
    }
  } catch (const RaisedError&) {
    throw;
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    rethrow_at(n.line, e);
  }
  return Flow::kNormal;
}

Interp::Flow Interp::exec_for(const Node& n, std::string& out, const ScopePtr& scope) {
  std::vector<Value> items = iterate(eval(*n.expr, scope));
  if (n.cond) {  // `for x in xs if cond`: filtered before the loop, so loop.length counts what is left
    std::vector<Value> kept;
    for (Value& item : items) {
      count_iterations(1);
      auto s = std::make_shared<Scope>();
      s->parent = scope;
      assign(n.target, item, s, n.line);
      if (truthy(eval(*n.cond, s))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const size_t len = items.size();
  // One loop object for the whole loop, updated in place each iteration, like jinja2's LoopContext.
  auto index = std::make_shared<int64_t>(0);
  int deepest = 0;  // previtem/nextitem come from `items`, which bounds the object's depth
  for (const Value& item : items) deepest = std::max(deepest, item.depth());
  Value loop = Value::dict({}).with_depth_bound(deepest + 1);
  Dict& fields = loop.mutable_dict();
  for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                        "previtem", "nextitem"})
    fields.items.emplace_back(k, Value());
  fields.items.emplace_back("cycle", Value::function("loop.cycle", [index](Interp&, CallArgs& a) {
                              if (a.args.empty()) fail("loop.cycle() needs at least one argument");
                              return a.args[static_cast<size_t>(*index) % a.args.size()];
                            }));
  const int64_t count = static_cast<int64_t>(len);
  for (size_t i = 0; i < len; ++i) {
    count_iterations(1);
    const int64_t idx = static_cast<int64_t>(i);
    *index = idx;
    auto& f = fields.items;
    f[0].second = Value::integer(idx + 1);
    f[1].second = Value::integer(idx);
    f[2].second = Value::integer(count - idx);
    f[3].second = Value::integer(count - idx - 1);
    f[4].second = Value::boolean(i == 0);
    f[5].second = Value::boolean(i + 1 == len);
    f[6].second = Value::integer(count);
    f[7].second = Value::integer(1);
    f[8].second = Value::integer(0);
    f[9].second = i > 0 ? items[i - 1] : Value::undefined("there is no previous item");
    f[10].second = i + 1 < len ? items[i + 1] : Value::undefined("there is no next item");
    auto s = std::make_shared<Scope>();
    s->parent = scope;
    assign(n.target, items[i], s, n.line);
    s->vars["loop"] = loop;
    if (exec(n.body, out, s) == Flow::kBreak) break;
  }
  if (len == 0) return exec(n.else_body, out, scope);
  return Flow::kNormal;
}

void Interp::assign(const Target& t, const Value& v, const ScopePtr& scope, int line) {
  if (!t.attr.empty()) {
    Value ns = lookup(t.names[0], scope);
    if (!ns.is_namespace())
      fail("cannot assign attribute on non-namespace object ('{}' is {})", t.names[0], type_name(ns));
    if (t.attr[0] == '_') fail("cannot store the underscore-prefixed attribute '{}' on a namespace", t.attr);
    ns.mutable_dict().set(t.attr, v);
    return;
  }
  if (!t.tuple) {
    scope->vars[t.names[0]] = v;
    return;
  }
  std::vector<Value> parts = iterate(v);
  if (parts.size() < t.names.size())
    fail("not enough values to unpack (expected {}, got {})", t.names.size(), parts.size());
  if (parts.size() > t.names.size()) fail("too many values to unpack (expected {})", t.names.size());
  for (size_t i = 0; i < parts.size(); ++i) scope->vars[t.names[i]] = parts[i];
}

void Interp::define_macro(const Node& n, const ScopePtr& scope) {
  const Node* node = &n;
  std::weak_ptr<Scope> weak = scope;  // the macro lives in this scope; a strong pointer would be a cycle
  scope->vars[n.text] = Value::function(n.text, [node, weak](Interp& in, CallArgs& a) -> Value {
    ScopePtr closure = weak.lock();
    if (!closure) fail("macro '{}' called after its scope ended", node->text);
    const auto& params = node->assigns;
    if (a.args.size() > params.size()) fail("macro '{}' takes not more than {} argument(s)", node->text, params.size());
    auto s = std::make_shared<Scope>();
    s->parent = closure;
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < a.args.size(); ++i) {
      s->vars[params[i].first] = a.args[i];
      bound[i] = true;
    }
    for (auto& [k, v] : a.kwargs) {
      size_t i = 0;
      while (i < params.size() && params[i].first != k) ++i;
      if (i == params.size()) fail("macro '{}' takes no keyword argument '{}'", node->text, k);
      if (bound[i]) fail("macro '{}' got multiple values for argument '{}'", node->text, k);
      s->vars[k] = v;
      bound[i] = true;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      s->vars[params[i].first] =
          params[i].second ? in.eval(*params[i].second, s)
                           : Value::undefined(fmt::format("parameter '{}' was not provided", params[i].first));
    }
    std::string out;
    in.exec(node->body, out, s);
    return Value::string(std::move(out));
  });
}

Value Interp::apply_filters(const std::vector<FilterCall>& filters, Value v, const ScopePtr& scope) {
  for (const FilterCall& f : filters) {
    CallArgs args = eval_args(f.args, scope);
    v = apply_filter(f.name, v, args);
  }
  return v;
}

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.is_function()) return callee.fn().call(*this, args);
  if (callee.is_undefined()) undefined_error(callee);
  fail("'{}' object is not callable", type_name(callee));
}

Value Interp::apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  FilterFn f = find_filter(name);
  if (!f) fail("no filter named '{}'", name);
  return f(*this, input, args);
}

bool Interp::apply_test(std::string_view name, const Value& input, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) fail("no test named '{}'", name);
  return t(*this, input, args);
}

Value Interp::get_attr(const Value& obj, const std::string& name) {
  Value method;
  switch (obj.type()) {
    case Value::Type::kUndefined: undefined_error(obj);
    case Value::Type::kNamespace:
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return no_attribute(obj, name);
    case Value::Type::kDict:
      if (get_method(obj, name, &method)) return method;
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return no_attribute(obj, name);
    default:
      if (get_method(obj, name, &method)) return method;
      return no_attribute(obj, name);
  }
}

Value Interp::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.str())) return *v;
  } else if (((obj.is_list() && !obj.is_generator()) || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.get_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      std::u32string u = text::decode(obj.str());
      int64_t n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(text::encode(std::u32string(1, u[static_cast<size_t>(i)])));
    }
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_desc(obj), i));
  }
  if (key.is_string()) {  // jinja2 falls back to the attribute of that name
    if (obj.is_namespace()) return get_attr(obj, key.str());
    Value method;
    if (get_method(obj, key.str(), &method)) return method;
  }
  return Value::undefined(fmt::format("'{}' has no attribute {}", object_desc(obj), repr(key)));
}

CallArgs Interp::eval_args(const std::vector<Arg>& args, const ScopePtr& scope) {
  CallArgs out;
  for (const Arg& a : args) {
    if (a.name.empty())
      out.args.push_back(eval(*a.value, scope));
    else
      out.kwargs.emplace_back(a.name, eval(*a.value, scope));
  }
  return out;
}

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
  DepthGuard guard(depth_);
  try {
    return eval_impl(e, scope);
  } catch (const RaisedError&) {
    throw;
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& err) {
    rethrow_at(e.line, err);
  }
}

Value Interp::eval_impl(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kConst: return e.value;
    case ExprKind::kName: return lookup(e.name, scope);
    case ExprKind::kList: {
      std::vector<Value> items;
      items.reserve(e.kids.size());
      for (const auto& k : e.kids) items.push_back(eval(*k, scope));
      return Value::list(std::move(items), e.tuple);
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
        Value k = eval(*e.kids[i], scope);
        if (!k.is_string()) fail("dict keys must be strings in this template engine, got {}", type_name(k));
        d.set(k.str(), eval(*e.kids[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kAttr: return get_attr(eval(*e.kids[0], scope), e.name);
    case ExprKind::kItem: {
      Value obj = eval(*e.kids[0], scope);
      return get_item(obj, eval(*e.kids[1], scope));
    }
    case ExprKind::kSlice: return eval_slice(e, scope);
    case ExprKind::kCall: {
      Value callee = eval(*e.kids[0], scope);
      CallArgs args = eval_args(e.args, scope);
      return call(callee, args);
    }
    case ExprKind::kFilter: {
      Value input = eval(*e.kids[0], scope);
      CallArgs args = eval_args(e.args, scope);
      return apply_filter(e.name, input, args);
    }
    case ExprKind::kTest: {
      Value input = eval(*e.kids[0], scope);
      CallArgs args = eval_args(e.args, scope);
      return Value::boolean(apply_test(e.name, input, args) != e.negated);
    }
    case ExprKind::kNot: return Value::boolean(!truthy(eval(*e.kids[0], scope)));
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.kids[0], scope);
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number())
        fail("bad operand type for unary {}: '{}'", e.kind == ExprKind::kNeg ? '-' : '+', type_name(v));
      if (e.kind == ExprKind::kPos) return v.is_bool() ? Value::integer(v.get_int()) : v;
      if (v.is_float()) return Value::real(-v.as_double());
      return Value::integer(checked(sub_ov, 0, v.get_int()));
    }
    case ExprKind::kBinary: {
      Value a = eval(*e.kids[0], scope);
      return binary(e.name, a, eval(*e.kids[1], scope));
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.kids[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.kids[i + 1], scope);
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==")
          r = equals(left, right);
        else if (op == "!=")
          r = !equals(left, right);
        else if (op == "in")
          r = contains(right, left);
        else if (op == "not in")
          r = !contains(right, left);
        else {
          int c = compare(left, right, op);
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kAnd: {
      Value a = eval(*e.kids[0], scope);
      return truthy(a) ? eval(*e.kids[1], scope) : a;
    }
    case ExprKind::kOr: {
      Value a = eval(*e.kids[0], scope);
      return truthy(a) ? a : eval(*e.kids[1], scope);
    }
    case ExprKind::kCond:
      if (truthy(eval(*e.kids[1], scope))) return eval(*e.kids[0], scope);
      if (e.kids[2]) return eval(*e.kids[2], scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined", e.line));
  }
  fail("internal error: unknown expression kind");
}

Value Interp::eval_slice(const Expr& e, const ScopePtr& scope) {
  Value obj = eval(*e.kids[0], scope);
  if (obj.is_undefined()) undefined_error(obj);
  // Slices bypass jinja2's getitem fallback, so slicing a non-sequence is Python's TypeError.
  if ((!obj.is_list() && !obj.is_string()) || obj.is_generator())
    fail("'{}' object is not subscriptable", type_name(obj));
  auto part = [&](size_t i, bool* given) -> int64_t {
    *given = false;
    if (!e.kids[i]) return 0;
    Value v = eval(*e.kids[i], scope);
    if (v.is_none()) return 0;
    if (!v.is_int() && !v.is_bool()) fail("slice indices must be integers or None, not {}", type_name(v));
    *given = true;
    return v.get_int();
  };
  bool has_start, has_stop, has_step;
  int64_t start = part(1, &has_start), stop = part(2, &has_stop), step = part(3, &has_step);
  if (!has_step) step = 1;
  if (step == 0) fail("slice step cannot be zero");
  std::u32string chars;
  if (obj.is_string()) chars = text::decode(obj.str());
  const int64_t n = obj.is_list() ? static_cast<int64_t>(obj.items().size()) : static_cast<int64_t>(chars.size());
  // Python's slice.indices()
  const int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? n - 1 : n;
  auto clamp = [&](int64_t v, bool given, int64_t def) {
    if (!given) return def;
    if (v < 0) v = std::max(v + n, lower);
    return std::min(v, upper);
  };
  start = clamp(start, has_start, step < 0 ? upper : lower);
  stop = clamp(stop, has_stop, step < 0 ? lower : upper);
  std::vector<Value> items;
  std::u32string sub;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_list())
      items.push_back(obj.items()[static_cast<size_t>(i)]);
    else
      sub.push_back(chars[static_cast<size_t>(i)]);
  }
  if (obj.is_list()) return Value::list(std::move(items), obj.is_tuple());
  return Value::string(text::encode(sub));
}

Value Interp::binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string x = a.is_string() ? std::string() : to_str(a), y = b.is_string() ? std::string() : to_str(b);
    const std::string& l = a.is_string() ? a.str() : x;
    const std::string& r = b.is_string() ? b.str() : y;
    check_size(l.size() + r.size());
    return Value::string(l + r);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto unsupported = [&]() -> Value {
    if (op == "+" && (a.is_string() || a.is_list()))
      fail("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a));
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  const int64_t x = a.is_number() ? a.get_int() : 0, y = b.is_number() ? b.get_int() : 0;
  if (op == "+") {
    if (ints) return Value::integer(checked(add_ov, x, y));
    if (nums) return Value::real(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value::string(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() && !b.is_generator()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) return Value::integer(checked(sub_ov, x, y));
    if (nums) return Value::real(a.as_double() - b.as_double());
    return unsupported();
  }
  if (op == "*") {
    if (ints) return Value::integer(checked(mul_ov, x, y));
    if (nums) return Value::real(a.as_double() * b.as_double());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : &b;
    const Value* times = seq == &a ? &b : &a;
    if ((seq->is_string() || (seq->is_list() && !seq->is_generator())) && (times->is_int() || times->is_bool())) {
      int64_t n = std::max<int64_t>(0, times->get_int());
      if (seq->is_string()) {
        if (n > 0)
          check_size(seq->str().size() * static_cast<size_t>(std::min<int64_t>(n, int64_t(kMaxStringBytes) + 1)));
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->str();
        return Value::string(std::move(s));
      }
      if (n > 0)
        count_iterations(seq->items().size() * static_cast<size_t>(std::min<int64_t>(n, kMaxLoopIterations + 1)));
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(items), seq->is_tuple());
    }
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_double() == 0.0) fail("division by zero");
    return Value::real(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(python_percent_format(a.str(), b));
    if (!nums) return unsupported();
    if (ints) {
      if (y == 0) fail("{}", op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
      if (x == INT64_MIN && y == -1) overflow_error();
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    double vx = a.as_double(), wx = b.as_double();
    if (wx == 0.0) fail("{}", op == "//" ? "float floor division by zero" : "float modulo");
    double mod = std::fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod != 0.0) {
      if ((wx < 0) != (mod < 0)) {
        mod += wx;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, wx);
    }
    if (op == "%") return Value::real(mod);
    double floordiv;
    if (div != 0.0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, vx / wx);
    }
    return Value::real(floordiv);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && y >= 0) {
      int64_t result = 1, base = x, e = y;
      while (e > 0) {
        if (e & 1) result = checked(mul_ov, result, base);
        e >>= 1;
        if (e > 0) base = checked(mul_ov, base, base);
      }
      return Value::integer(result);
    }
    double bx = a.as_double(), ex = b.as_double();
    if (bx == 0.0 && ex < 0) fail("0.0 cannot be raised to a negative power");
    if (bx < 0 && ex != std::floor(ex)) fail("negative number raised to a fractional power (complex result)");
    double r = std::pow(bx, ex);
    if (std::isinf(r) && std::isfinite(bx) && std::isfinite(ex)) fail("(34, 'Numerical result out of range')");
    return Value::real(r);
  }
  fail("unknown operator '{}'", op);
}

}  // namespace moecel::jinja
