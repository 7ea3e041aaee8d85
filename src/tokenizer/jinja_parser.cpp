// Jinja parser (see jinja_parser.h), statements: a recursive-descent port of jinja2.parser.Parser for the
// tags chat templates use (for, if, set, macro, filter, with, generation, break/continue); expressions are in
// jinja_parse_expr.cpp.
#include "tokenizer/jinja_parser.h"

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_parser_impl.h"

namespace moecel::jinja {

// Parses text and tags until a block tag named in `ends`; leaves the stream on that name, stores it in
// *matched. With no ends, parses to the end of the template.
NodeList Parser::parse_body(std::initializer_list<const char*> ends, std::string* matched, const char* open_tag,
                            int open_line) {
  Guard guard(this, cur().line);
  NodeList body;
  while (true) {
    const Token& t = cur();
    if (t.type == Tok::kEof) {
      if (ends.size() == 0) return body;
      error(t.line, fmt::format("unexpected end of template: the '{}' block from line {} is not closed (expected "
                                "'{}')",
                                open_tag, open_line, *ends.begin()));
    }
    if (t.type == Tok::kData) {
      auto n = std::make_unique<Node>();
      n->kind = NodeKind::kText;
      n->line = t.line;
      n->text = t.text;
      body.push_back(std::move(n));
      next();
    } else if (t.type == Tok::kVarBegin) {
      auto n = std::make_unique<Node>();
      n->kind = NodeKind::kOutput;
      n->line = t.line;
      next();
      n->expr = parse_tuple(true, false, nullptr);
      expect(Tok::kVarEnd, "end of print statement '}}'");
      body.push_back(std::move(n));
    } else if (t.type == Tok::kBlockBegin) {
      next();
      if (cur().type != Tok::kName) error(cur().line, "expected a tag name after '{%', got " + describe(cur()));
      for (const char* e : ends)
        if (cur().text == e) {
          *matched = e;
          next();
          return body;
        }
      body.push_back(parse_statement(open_tag, open_line));
      expect_block_end();
    } else {
      error(t.line, "unexpected " + describe(t));
    }
  }
}

NodePtr Parser::node(NodeKind kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

NodePtr Parser::parse_statement(const char* open_tag, int open_line) {
  const std::string tag = cur().text;
  const int line = cur().line;
  if (tag == "for") return parse_for(line);
  if (tag == "if") return parse_if(line);
  if (tag == "set") return parse_set(line);
  if (tag == "macro") return parse_macro(line);
  if (tag == "filter") {
    next();
    NodePtr n = node(NodeKind::kFilterBlock, line);
    n->filters = parse_filter_chain(true);
    n->body = parse_block_body("endfilter", "filter", line);
    return n;
  }
  if (tag == "with") return parse_with(line);
  if (tag == "generation") {
    next();
    NodePtr n = node(NodeKind::kGeneration, line);
    n->body = parse_block_body("endgeneration", "generation", line);
    return n;
  }
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) error(line, fmt::format("'{}' outside of a for loop", tag));
    next();
    return node(tag == "break" ? NodeKind::kBreak : NodeKind::kContinue, line);
  }
  static const char* kUnsupported[] = {"include",    "import", "from",  "extends", "block",     "call",
                                       "autoescape", "do",     "trans", "print",   "pluralize", "raw"};
  for (const char* u : kUnsupported)
    if (tag == u) error(line, fmt::format("the '{{% {} %}}' tag is not supported by this template engine", tag));
  if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif") {
    if (open_line == 0) error(line, fmt::format("unexpected '{}': there is no open block to close", tag));
    error(line,
          fmt::format("unexpected '{}': the innermost open block is '{}' from line {}", tag, open_tag, open_line));
  }
  error(line, fmt::format("unknown tag '{}'", tag));
}

NodeList Parser::parse_block_body(const char* end, const char* open_tag, int open_line) {
  skip_op(":");
  expect_block_end();
  std::string matched;
  return parse_body({end}, &matched, open_tag, open_line);
}

Target Parser::parse_target(bool allow_attr, bool stop_at_in) {
  Target t;
  int line = cur().line;
  if (allow_attr && cur().type == Tok::kName && look().type == Tok::kOp && look().text == ".") {
    t.names.push_back(expect_name());
    next();
    t.attr = expect_name();
    return t;
  }
  bool parens = skip_op("(");
  while (true) {
    if (cur().type != Tok::kName) error(line, "cannot assign to " + describe(cur()));
    std::string n = expect_name();
    if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
      error(line, "cannot assign to constant '" + n + "'");
    t.names.push_back(n);
    if (!skip_op(",")) break;
    t.tuple = true;
    if (parens ? is_op(")") : (stop_at_in ? is_name("in") : (is_op("=") || cur().type == Tok::kBlockEnd))) break;
  }
  if (parens) expect_op(")");
  return t;
}

NodePtr Parser::parse_for(int line) {
  next();
  NodePtr n = node(NodeKind::kFor, line);
  n->target = parse_target(false, true);
  if (!skip_name("in")) error(cur().line, "expected 'in' in for loop, got " + describe(cur()));
  n->expr = parse_tuple(false, false, "recursive");
  if (skip_name("if")) n->cond = parse_expression(true);
  if (is_name("recursive")) error(cur().line, "recursive for loops are not supported");
  skip_op(":");
  expect_block_end();
  ++loop_depth_;
  std::string matched;
  n->body = parse_body({"endfor", "else"}, &matched, "for", line);
  --loop_depth_;
  if (matched == "else") n->else_body = parse_block_body("endfor", "for", line);
  return n;
}

NodePtr Parser::parse_if(int line) {
  next();
  NodePtr n = node(NodeKind::kIf, line);
  while (true) {
    ExprPtr cond = parse_tuple(false, false, nullptr);
    skip_op(":");
    expect_block_end();
    std::string matched;
    NodeList body = parse_body({"elif", "else", "endif"}, &matched, "if", line);
    n->branches.emplace_back(std::move(cond), std::move(body));
    if (matched == "elif") continue;
    if (matched == "else") n->branches.emplace_back(nullptr, parse_block_body("endif", "if", line));
    return n;
  }
}

NodePtr Parser::parse_set(int line) {
  next();
  Target target = parse_target(true, false);
  if (skip_op("=")) {
    NodePtr n = node(NodeKind::kSet, line);
    n->target = std::move(target);
    n->expr = parse_tuple(true, false, nullptr);
    return n;
  }
  NodePtr n = node(NodeKind::kSetBlock, line);
  n->target = std::move(target);
  if (is_op("|")) n->filters = parse_filter_chain(false);
  n->body = parse_block_body("endset", "set", line);
  return n;
}

NodePtr Parser::parse_macro(int line) {
  next();
  NodePtr n = node(NodeKind::kMacro, line);
  n->text = expect_name();
  expect_op("(");
  while (!is_op(")")) {
    if (!n->assigns.empty()) expect_op(",");
    if (is_op(")")) break;
    std::string param = expect_name();
    ExprPtr def;
    if (skip_op("="))
      def = parse_expression(true);
    else if (!n->assigns.empty() && n->assigns.back().second)
      error(line, "non-default argument follows default argument in macro '" + n->text + "'");
    n->assigns.emplace_back(param, std::move(def));
  }
  next();
  int saved = loop_depth_;
  loop_depth_ = 0;  // break/continue cannot cross a macro boundary
  n->body = parse_block_body("endmacro", "macro", line);
  loop_depth_ = saved;
  return n;
}

NodePtr Parser::parse_with(int line) {
  next();
  NodePtr n = node(NodeKind::kWith, line);
  while (cur().type != Tok::kBlockEnd) {
    if (!n->assigns.empty()) expect_op(",");
    std::string name = expect_name();
    expect_op("=");
    n->assigns.emplace_back(name, parse_expression(true));
  }
  n->body = parse_block_body("endwith", "with", line);
  return n;
}

std::vector<FilterCall> Parser::parse_filter_chain(bool start_inline) {
  std::vector<FilterCall> out;
  while (start_inline || skip_op("|")) {
    start_inline = false;
    FilterCall f;
    f.line = cur().line;
    f.name = parse_dotted_name();
    check_filter(f.name, f.line);
    if (is_op("(")) f.args = parse_call_args();
    out.push_back(std::move(f));
  }
  return out;
}

NodeList parse_template(std::string_view source, const LexOptions& opt) {
  return Parser(tokenize(source, opt)).parse();
}

}  // namespace moecel::jinja
