// Jinja parser, expressions: precedence climbing as in jinja2.parser, lowest first: `x if c else y`, or, and,
// not, comparisons / in, + -, ~, * / // %, **, unary - +, then postfix (.attr [item] (call)) and filters / tests.
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_parser_impl.h"

namespace moecel::jinja {

bool Parser::is_tuple_end(const char* extra_end) const {
  if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
  return extra_end && is_name(extra_end);
}

ExprPtr Parser::parse_tuple(bool with_cond, bool explicit_parens, const char* extra_end) {
  int line = cur().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(parse_expression(with_cond));
    if (is_op(","))
      is_tuple = true;
    else
      break;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) error(cur().line, "expected an expression, got " + describe(cur()));
  }
  ExprPtr e = make(ExprKind::kList, line, std::move(items));
  e->tuple = true;
  return e;
}

ExprPtr Parser::parse_expression(bool with_cond) {
  Guard guard(this, cur().line);
  if (!with_cond) return parse_or();
  int line = cur().line;
  ExprPtr e = parse_or();
  while (skip_name("if")) {
    ExprPtr cond = parse_or();
    ExprPtr other;
    if (skip_name("else")) other = parse_expression(true);
    std::vector<ExprPtr> kids;
    kids.push_back(std::move(e));
    kids.push_back(std::move(cond));
    kids.push_back(std::move(other));
    e = make(ExprKind::kCond, line, std::move(kids));
  }
  return e;
}

ExprPtr Parser::binary(ExprKind kind, int line, ExprPtr a, ExprPtr b, std::string op) {
  std::vector<ExprPtr> kids;
  kids.push_back(std::move(a));
  kids.push_back(std::move(b));
  ExprPtr e = make(kind, line, std::move(kids));
  e->name = std::move(op);
  finish(*e);
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (is_name("or")) {
    int line = cur().line;
    next();
    e = binary(ExprKind::kOr, line, std::move(e), parse_and());
  }
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (is_name("and")) {
    int line = cur().line;
    next();
    e = binary(ExprKind::kAnd, line, std::move(e), parse_not());
  }
  return e;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    Guard guard(this, cur().line);
    int line = cur().line;
    next();
    std::vector<ExprPtr> kids;
    kids.push_back(parse_not());
    return make(ExprKind::kNot, line, std::move(kids));
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  int line = cur().line;
  ExprPtr first = parse_math1();
  std::vector<ExprPtr> kids;
  std::vector<std::string> ops;
  while (true) {
    std::string op;
    if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = cur().text;
      next();
    } else if (is_name("in")) {
      op = "in";
      next();
    } else if (is_name("not") && look().type == Tok::kName && look().text == "in") {
      op = "not in";
      next();
      next();
    } else {
      break;
    }
    if (kids.empty()) kids.push_back(std::move(first));
    kids.push_back(parse_math1());
    ops.push_back(op);
  }
  if (kids.empty()) return first;
  ExprPtr e = make(ExprKind::kCompare, line, std::move(kids));
  e->ops = std::move(ops);
  return e;
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    std::string op = cur().text;
    int line = cur().line;
    next();
    e = binary(ExprKind::kBinary, line, std::move(e), parse_concat(), op);
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  ExprPtr e = parse_math2();
  while (is_op("~")) {
    int line = cur().line;
    next();
    e = binary(ExprKind::kBinary, line, std::move(e), parse_math2(), "~");
  }
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = cur().text;
    int line = cur().line;
    next();
    e = binary(ExprKind::kBinary, line, std::move(e), parse_pow(), op);
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (is_op("**")) {
    int line = cur().line;
    next();
    e = binary(ExprKind::kBinary, line, std::move(e), parse_unary(true), "**");
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  Guard guard(this, cur().line);
  int line = cur().line;
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    ExprKind kind = is_op("-") ? ExprKind::kNeg : ExprKind::kPos;
    next();
    std::vector<ExprPtr> kids;
    kids.push_back(parse_unary(false));
    e = make(kind, line, std::move(kids));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  int line = t.line;
  switch (t.type) {
    case Tok::kName: {
      std::string n = t.text;
      next();
      if (n == "true" || n == "True") return constant(Value::boolean(true), line);
      if (n == "false" || n == "False") return constant(Value::boolean(false), line);
      if (n == "none" || n == "None") return constant(Value::none(), line);
      ExprPtr e = make(ExprKind::kName, line);
      e->name = n;
      return e;
    }
    case Tok::kString: {
      std::string s;
      while (cur().type == Tok::kString) {  // adjacent literals concatenate
        s += cur().text;
        next();
      }
      return constant(Value::string(std::move(s)), line);
    }
    case Tok::kInt: {
      int64_t v = t.ival;
      next();
      return constant(Value::integer(v), line);
    }
    case Tok::kFloat: {
      double v = t.fval;
      next();
      return constant(Value::real(v), line);
    }
    case Tok::kOp:
      if (t.text == "(") {
        next();
        ExprPtr e = parse_tuple(true, true, nullptr);
        expect_op(")");
        return e;
      }
      if (t.text == "[") return parse_list(line);
      if (t.text == "{") return parse_dict(line);
      break;
    default: break;
  }
  error(line, "unexpected " + describe(t));
}

ExprPtr Parser::parse_list(int line) {
  next();
  std::vector<ExprPtr> items;
  while (!is_op("]")) {
    if (!items.empty()) expect_op(",");
    if (is_op("]")) break;
    items.push_back(parse_expression(true));
  }
  expect_op("]");
  return make(ExprKind::kList, line, std::move(items));
}

ExprPtr Parser::parse_dict(int line) {
  next();
  std::vector<ExprPtr> kids;
  while (!is_op("}")) {
    if (!kids.empty()) expect_op(",");
    if (is_op("}")) break;
    kids.push_back(parse_expression(true));
    expect_op(":");
    kids.push_back(parse_expression(true));
  }
  expect_op("}");
  return make(ExprKind::kDict, line, std::move(kids));
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    if (is_op(".") || is_op("["))
      e = parse_subscript(std::move(e));
    else if (is_op("("))
      e = parse_call(std::move(e));
    else
      return e;
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
  while (true) {
    if (is_op("|"))
      e = parse_filter(std::move(e));
    else if (is_name("is"))
      e = parse_test(std::move(e));
    else if (is_op("("))
      e = parse_call(std::move(e));
    else
      return e;
  }
}

ExprPtr Parser::parse_subscript(ExprPtr obj) {
  int line = cur().line;
  if (skip_op(".")) {
    const Token& a = cur();
    std::vector<ExprPtr> kids;
    kids.push_back(std::move(obj));
    if (a.type == Tok::kName) {
      std::string n = a.text;
      next();
      ExprPtr e = make(ExprKind::kAttr, line, std::move(kids));
      e->name = n;
      return e;
    }
    if (a.type != Tok::kInt) error(a.line, "expected a name or number after '.', got " + describe(a));
    kids.push_back(constant(Value::integer(a.ival), a.line));
    next();
    return make(ExprKind::kItem, line, std::move(kids));
  }
  next();  // '['
  std::vector<ExprPtr> subs;
  bool slice = false;
  while (!is_op("]")) {
    if (!subs.empty()) expect_op(",");
    subs.push_back(parse_subscribed(&slice));
  }
  expect_op("]");
  if (subs.empty()) error(line, "expected a subscript inside '[]'");
  if (slice) {
    if (subs.size() != 1) error(line, "multi-dimensional slices are not supported");
    std::vector<ExprPtr> kids;
    kids.push_back(std::move(obj));
    for (auto& k : subs[0]->kids) kids.push_back(std::move(k));
    return make(ExprKind::kSlice, line, std::move(kids));
  }
  std::vector<ExprPtr> kids;
  kids.push_back(std::move(obj));
  if (subs.size() == 1) {
    kids.push_back(std::move(subs[0]));
  } else {
    ExprPtr key = make(ExprKind::kList, line, std::move(subs));
    key->tuple = true;
    kids.push_back(std::move(key));
  }
  return make(ExprKind::kItem, line, std::move(kids));
}

// One subscript: an expression, or a slice returned as a kList holder of (start, stop, step).
ExprPtr Parser::parse_subscribed(bool* slice) {
  int line = cur().line;
  std::vector<ExprPtr> parts;
  if (skip_op(":")) {
    parts.push_back(nullptr);
  } else {
    ExprPtr e = parse_expression(true);
    if (!skip_op(":")) return e;
    parts.push_back(std::move(e));
  }
  *slice = true;
  if (is_op(":") || is_op("]") || is_op(","))
    parts.push_back(nullptr);
  else
    parts.push_back(parse_expression(true));
  if (skip_op(":") && !is_op("]") && !is_op(","))
    parts.push_back(parse_expression(true));
  else
    parts.push_back(nullptr);
  return make(ExprKind::kList, line, std::move(parts));
}

std::vector<Arg> Parser::parse_call_args() {
  int line = cur().line;
  expect_op("(");
  std::vector<Arg> args;
  bool seen_kw = false;
  while (!is_op(")")) {
    if (!args.empty()) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) error(cur().line, "*args and **kwargs in calls are not supported");
    Arg a;
    if (cur().type == Tok::kName && look().type == Tok::kOp && look().text == "=") {
      a.name = cur().text;
      next();
      next();
      seen_kw = true;
    } else if (seen_kw) {
      error(line, "positional argument follows keyword argument");
    }
    a.value = parse_expression(true);
    args.push_back(std::move(a));
  }
  next();
  return args;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  int line = cur().line;
  std::vector<ExprPtr> kids;
  kids.push_back(std::move(callee));
  ExprPtr e = make(ExprKind::kCall, line, std::move(kids));
  e->args = parse_call_args();
  finish(*e);
  return e;
}

std::string Parser::parse_dotted_name() {
  std::string name = expect_name();
  while (skip_op(".")) {
    name += '.';
    name += expect_name();
  }
  return name;
}

void Parser::check_filter(const std::string& name, int line) const {
  if (find_filter(name)) return;
  if (is_unsupported_filter(name)) error(line, "the '" + name + "' filter is not supported by this template engine");
  error(line, "no filter named '" + name + "'");
}

ExprPtr Parser::parse_filter(ExprPtr e) {
  next();  // '|'
  int line = cur().line;
  std::string name = parse_dotted_name();
  check_filter(name, line);
  std::vector<ExprPtr> kids;
  kids.push_back(std::move(e));
  ExprPtr f = make(ExprKind::kFilter, line, std::move(kids));
  f->name = name;
  if (is_op("(")) f->args = parse_call_args();
  finish(*f);
  return f;
}

ExprPtr Parser::parse_test(ExprPtr e) {
  int line = cur().line;
  next();  // 'is'
  bool negated = skip_name("not");
  std::string name = parse_dotted_name();
  if (!find_test(name)) {
    if (is_unsupported_test(name)) error(line, "the '" + name + "' test is not supported by this template engine");
    error(line, "no test named '" + name + "'");
  }
  std::vector<ExprPtr> kids;
  kids.push_back(std::move(e));
  ExprPtr t = make(ExprKind::kTest, line, std::move(kids));
  t->name = name;
  t->negated = negated;
  if (is_op("(")) {
    t->args = parse_call_args();
  } else {
    Tok ty = cur().type;
    bool arg_start = ty == Tok::kName || ty == Tok::kString || ty == Tok::kInt || ty == Tok::kFloat || is_op("(") ||
                     is_op("[") || is_op("{");
    if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error(cur().line, "you cannot chain multiple tests with 'is'");
      Arg a;
      a.value = parse_postfix(parse_primary());
      t->args.push_back(std::move(a));
    }
  }
  finish(*t);
  return t;
}

}  // namespace moecel::jinja
