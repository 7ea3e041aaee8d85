// Jinja parser: tokens to a syntax tree, following jinja2.parser's grammar and operator precedence.
// Unsupported tags and unknown filters or tests are rejected here, with their line, before anything renders.
#pragma once
#include <string_view>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace moecel::jinja {

// Deepest nesting of blocks or expressions a template may use; real chat templates stay below 20.
inline constexpr int kMaxNesting = 128;

// Throws moecel::Error "template line N: ..." on syntax errors and unsupported constructs.
NodeList parse_template(std::string_view source, const LexOptions& opt);

}  // namespace moecel::jinja
