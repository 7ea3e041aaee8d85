// A Jinja2 template engine for chat templates: the subset of Jinja2 that HuggingFace chat templates use,
// rendering byte-identical to jinja2 configured the way transformers configures it (trim_blocks,
// lstrip_blocks, loop controls, an immutable sandbox). Anything outside the subset is rejected with an
// error naming the construct and its line; nothing a template does can crash, hang or exhaust memory.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (-, +), for (loop.*, else, filters, break/continue,
// unpacking), if/elif/else, set (incl. namespace attributes and block set), macro, filter and with blocks,
// {% generation %}, literals, arithmetic, comparisons, in / not in, and/or/not, x if c else y, ~, slicing,
// attribute / item access, str/dict/list methods, the common filters and tests, and the globals
// range, namespace, dict, raise_exception and strftime_now.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_value.h"

namespace moecel::jinja {

using Options = LexOptions;  // defaults: trim_blocks and lstrip_blocks on, trailing newline dropped
struct Node;

class Template {
 public:
  // Parses `source`; throws moecel::Error "template line N: ..." on syntax errors or unsupported constructs.
  explicit Template(std::string_view source, const Options& opt = {});

  // Renders with the variables of `context` (a dict / JSON object). Throws moecel::Error
  // "template line N: ..." on evaluation errors, and RaisedError (message unchanged) when the template
  // calls raise_exception().
  std::string render(const Value& context) const;
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> nodes_;
};

}  // namespace moecel::jinja
