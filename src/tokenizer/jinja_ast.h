// Syntax tree of a parsed Jinja template: expressions (Expr) and statements (Node). Every node keeps its
// source line for error messages; expressions also keep their depth, which the parser bounds so that
// evaluating or destroying a tree can never exhaust the stack.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace moecel::jinja {

struct Expr;
struct Node;
using ExprPtr = std::unique_ptr<Expr>;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

enum class ExprKind {
  kConst,    // value
  kName,     // name
  kList,     // kids: items (tuple when `tuple`)
  kDict,     // kids: key0, value0, key1, value1, ...
  kAttr,     // kids[0].name
  kItem,     // kids[0][kids[1]]
  kSlice,    // kids[0][kids[1]:kids[2]:kids[3]], absent parts are null
  kCall,     // kids[0](args)
  kFilter,   // kids[0] | name(args)
  kTest,     // kids[0] is [not] name(args)
  kNot,      // not kids[0]
  kNeg,      // -kids[0]
  kPos,      // +kids[0]
  kBinary,   // kids[0] op kids[1], op in + - * / // % ** ~
  kCompare,  // kids[0] ops[0] kids[1] ops[1] kids[2] ... (chained like Python)
  kAnd,      // kids[0] and kids[1]
  kOr,       // kids[0] or kids[1]
  kCond,     // kids[0] if kids[1] else kids[2] (kids[2] may be null)
};

struct Arg {
  std::string name;  // empty for positional arguments
  ExprPtr value;
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  int depth = 1;
  bool tuple = false;    // kList
  bool negated = false;  // kTest
  Value value;           // kConst
  std::string name;      // kName, kAttr, kFilter, kTest, kBinary (operator)
  std::vector<ExprPtr> kids;
  std::vector<std::string> ops;  // kCompare
  std::vector<Arg> args;         // kCall, kFilter, kTest
};

// An assignment target: `x`, `a, b` or `ns.attr`.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string attr;  // set: names[0].attr = ...
};

// A filter applied by `{% filter f %}` or `{% set x | f %}`.
struct FilterCall {
  std::string name;
  std::vector<Arg> args;
  int line = 0;
};

enum class NodeKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches: (condition or null for else, body)
  kFor,       // for target in expr [if cond]: body [else: else_body]
  kSet,       // set target = expr
  kSetBlock,  // set target [| filters] %}body{% endset
  kMacro,     // macro name(params) body
  kBreak,
  kContinue,
  kFilterBlock,  // filter filters %}body{% endfilter
  kWith,         // with assigns %}body{% endwith
  kGeneration,   // transformers' {% generation %}: renders its body unchanged
};

struct Node {
  NodeKind kind = NodeKind::kText;
  int line = 0;
  std::string text;                                    // kText; kMacro: the macro's name
  ExprPtr expr;                                        // kOutput, kSet, kFor (iterable)
  ExprPtr cond;                                        // kFor: the `if` filter
  Target target;                                       // kFor, kSet, kSetBlock
  std::vector<std::pair<ExprPtr, NodeList>> branches;  // kIf
  NodeList body;
  NodeList else_body;                                    // kFor
  std::vector<FilterCall> filters;                       // kSetBlock, kFilterBlock
  std::vector<std::pair<std::string, ExprPtr>> assigns;  // kMacro: params and defaults; kWith
};

}  // namespace moecel::jinja
