// UTF-8 and Python `str` helpers for the Jinja engine. Python strings are sequences of code points, so
// lengths, indexing, slicing, case mapping, whitespace and repr() here follow Python's definitions, not bytes.
// Invalid UTF-8 bytes decode to U+DC80+byte (Python's "surrogateescape") so text round-trips unchanged.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moecel::jinja::text {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t cp);
bool is_ascii(std::string_view s);
size_t length(std::string_view s);  // in code points
// Code point index of byte offset `byte_pos` (which must be on a character boundary).
size_t cp_index(std::string_view s, size_t byte_pos);

bool is_space(char32_t c);  // str.isspace(): also what Python's `\s` and str.split() use
bool is_cased(char32_t c);
bool is_printable(char32_t c);  // str.isprintable(), decides repr() escapes

// str.strip / lstrip / rstrip; `chars` == nullptr strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split / str.rsplit; `sep` == nullptr splits on whitespace runs and drops empty parts. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);                  // str.capitalize()
std::string title_method(std::string_view s);                // str.title()
std::string title_filter(std::string_view s);                // Jinja's |title: capitalizes after -, whitespace, ( { [ <
std::string html_escape(std::string_view s);                 // markupsafe.escape
bool all_chars(std::string_view s, bool (*pred)(char32_t));  // False for ""; used by isdigit() and friends
bool cp_is_digit(char32_t c);
bool cp_is_alpha(char32_t c);
bool cp_is_alnum(char32_t c);
bool cp_is_lower(char32_t c);
bool cp_is_upper(char32_t c);
bool cp_is_ident_start(char32_t c);                   // Python identifier characters (letters, letter numbers, '_')
bool cp_is_ident_char(char32_t c);                    // ... and digits, combining marks, connector punctuation
bool has_cased(std::string_view s, bool want_upper);  // str.isupper()/islower(): some cased, none of the other

std::string repr(std::string_view s);  // Python repr() of a str, quotes included

}  // namespace moecel::jinja::text
