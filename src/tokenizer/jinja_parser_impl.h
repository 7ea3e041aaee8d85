// The Jinja parser's class, shared by jinja_parser.cpp (statements) and jinja_parse_expr.cpp (expressions).
// Internal to the engine: use parse_template() from jinja_parser.h.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja_parser.h"

namespace moecel::jinja {

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  NodeList parse() { return parse_body({}, nullptr, "", 0); }

 private:
  struct Guard {  // bounds parser recursion
    Guard(Parser* p, int line) : p_(p) {
      if (++p_->depth_ > kMaxNesting) p_->error(line, fmt::format("template nests deeper than {} levels", kMaxNesting));
    }
    ~Guard() { --p_->depth_; }
    Parser* p_;
  };

  [[noreturn]] void error(int line, const std::string& msg) const { fail("template line {}: {}", line, msg); }

  const Token& cur() const { return toks_[i_]; }
  const Token& look(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kData: return "template text";
      case Tok::kVarBegin: return "'{{'";
      case Tok::kVarEnd: return "end of print statement '}}'";
      case Tok::kBlockBegin: return "'{%'";
      case Tok::kBlockEnd: return "end of statement block '%}'";
      case Tok::kString: return "string literal";
      default: return "'" + t.text + "'";
    }
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur().line, fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) error(cur().line, "expected a name, got " + describe(cur()));
    std::string n = cur().text;
    next();
    return n;
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) error(cur().line, fmt::format("expected {}, got {}", what, describe(cur())));
    next();
  }
  void expect_block_end() { expect(Tok::kBlockEnd, "end of statement block '%}'"); }

  ExprPtr make(ExprKind kind, int line, std::vector<ExprPtr> kids = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->kids = std::move(kids);
    finish(*e);
    return e;
  }
  // Depth bounds the evaluator's recursion: left-associative chains (a + b + c ...) grow the tree
  // without growing the parser's own recursion, so this is checked on every node.
  void finish(Expr& e) {
    int d = 0;
    for (const auto& k : e.kids)
      if (k) d = std::max(d, k->depth);
    for (const auto& a : e.args) d = std::max(d, a.value->depth);
    e.depth = d + 1;
    if (e.depth > kMaxNesting) error(e.line, fmt::format("expression nests deeper than {} levels", kMaxNesting));
  }
  ExprPtr constant(Value v, int line) {
    ExprPtr e = make(ExprKind::kConst, line);
    e->value = std::move(v);
    return e;
  }

  // ---- statements (jinja_parser.cpp) ----
  // Parses text and tags until a block tag named in `ends`; leaves the stream on that name, stores it in
  // *matched. With no ends, parses to the end of the template.
  NodeList parse_body(std::initializer_list<const char*> ends, std::string* matched, const char* open_tag,
                      int open_line);
  NodePtr node(NodeKind kind, int line);
  NodePtr parse_statement(const char* open_tag, int open_line);
  NodeList parse_block_body(const char* end, const char* open_tag, int open_line);
  Target parse_target(bool allow_attr, bool stop_at_in);
  NodePtr parse_for(int line);
  NodePtr parse_if(int line);
  NodePtr parse_set(int line);
  NodePtr parse_macro(int line);
  NodePtr parse_with(int line);
  std::vector<FilterCall> parse_filter_chain(bool start_inline);

  // ---- expressions (jinja_parse_expr.cpp) ----
  bool is_tuple_end(const char* extra_end) const;
  ExprPtr parse_tuple(bool with_cond, bool explicit_parens, const char* extra_end);
  ExprPtr parse_expression(bool with_cond);
  ExprPtr binary(ExprKind kind, int line, ExprPtr a, ExprPtr b, std::string op = {});
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_list(int line);
  ExprPtr parse_dict(int line);
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_filter_expr(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr obj);
  // One subscript: an expression, or a slice returned as a kList holder of (start, stop, step).
  ExprPtr parse_subscribed(bool* slice);
  std::vector<Arg> parse_call_args();
  ExprPtr parse_call(ExprPtr callee);
  std::string parse_dotted_name();
  void check_filter(const std::string& name, int line) const;
  ExprPtr parse_filter(ExprPtr e);
  ExprPtr parse_test(ExprPtr e);

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace moecel::jinja
