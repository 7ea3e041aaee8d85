// Jinja lexer: splits template source into text and tag tokens with jinja2's exact whitespace rules
// (`{%-`/`-%}` stripping, trim_blocks, lstrip_blocks, `+` overrides, the dropped trailing newline), because
// chat-template output must match jinja2 byte for byte.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moecel::jinja {

struct LexOptions {
  bool trim_blocks = true;    // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;  // drop spaces and tabs before a block or comment tag at the start of a line
  bool keep_trailing_newline = false;
};

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // data, name, operator, or a string literal's decoded value
  int line = 1;
  int64_t ival = 0;
  double fval = 0;
};

// Throws moecel::Error "template line N: ..." on malformed input (unterminated tags, strings, comments).
std::vector<Token> tokenize(std::string_view source, const LexOptions& opt);

}  // namespace moecel::jinja
