// Evaluator of parsed Jinja templates: runs statements into an output string with jinja2's scoping (each
// for-loop iteration, macro call and with-block gets its own scope; if-blocks do not) and Python value
// semantics. Every render is bounded: recursion depth, total loop iterations and string sizes have limits,
// so a hostile template fails with an error instead of hanging or exhausting memory or stack.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace moecel::jinja {

inline constexpr int kMaxEvalDepth = 500;                    // nested evaluations (macro recursion)
inline constexpr size_t kMaxLoopIterations = 2'000'000;      // per render, all loops together
inline constexpr size_t kMaxStringBytes = size_t(64) << 20;  // any string a template builds
inline constexpr size_t kMaxRangeItems = 100'000;            // jinja2's sandbox MAX_RANGE

class Interp {
 public:
  Interp();
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  // Renders `nodes` with the variables of `context` (a dict) on top of the globals.
  std::string render(const NodeList& nodes, const Value& context);

  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
  bool apply_test(std::string_view name, const Value& input, CallArgs& args);
  Value get_attr(const Value& obj, const std::string& name);  // obj.name: attribute, then item
  Value get_item(const Value& obj, const Value& key);         // obj[key]: item, then attribute
  void count_iterations(size_t n);
  // Namespaces are the only mutable values, so the only way to build a reference cycle (ns.self = ns);
  // the interpreter empties them all when it is done so that such cycles cannot leak.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns); }
  static void check_size(size_t bytes);

 private:
  struct Scope {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;
  };
  using ScopePtr = std::shared_ptr<Scope>;
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const NodeList& nodes, std::string& out, const ScopePtr& scope);
  Flow exec_node(const Node& n, std::string& out, const ScopePtr& scope);
  Flow exec_for(const Node& n, std::string& out, const ScopePtr& scope);
  void define_macro(const Node& n, const ScopePtr& scope);
  Value apply_filters(const std::vector<FilterCall>& filters, Value v, const ScopePtr& scope);
  void assign(const Target& t, const Value& v, const ScopePtr& scope, int line);
  Value lookup(const std::string& name, const ScopePtr& scope) const;

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_impl(const Expr& e, const ScopePtr& scope);
  CallArgs eval_args(const std::vector<Arg>& args, const ScopePtr& scope);
  Value eval_slice(const Expr& e, const ScopePtr& scope);
  Value binary(const std::string& op, const Value& a, const Value& b);

  Dict globals_;
  std::vector<Value> namespaces_;
  int depth_ = 0;
  size_t iterations_ = 0;
};

}  // namespace moecel::jinja
