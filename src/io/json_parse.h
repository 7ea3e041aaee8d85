// Strict JSON parsing for checkpoint headers and config files: nlohmann silently keeps the last of
// duplicate keys, which would let a malformed file smuggle a second definition past validation.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace moecel {

// Parses `text`; throws moecel::Error "WHAT: invalid JSON: ..." / "WHAT: duplicate key 'k' ..." /
// "WHAT: JSON nested deeper than N levels".
nlohmann::json parse_json_strict(std::string_view text, const std::string& what, int max_depth = 64);

// The parser's message with non-ASCII bytes escaped as \xNN (its "last read" excerpt may be invalid UTF-8).
std::string json_error_message(const nlohmann::json::exception& e);

// Reads a whole (small) text file; throws "PATH: cannot open (reason)".
std::string read_text_file(const std::string& path);

}  // namespace moecel
