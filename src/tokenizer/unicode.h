// Unicode helpers for the tokenizer: UTF-8 decoding and lossy repair, the character classes of the pre-tokenizer
// regexes (\p{L}, \p{N}, \s, \w) and Unicode normalization, all matching what HuggingFace tokenizers computes
// (utf8proc data, corrected by unicode_tables.cpp where HF's Unicode versions differ).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moecel::unicode {

// Half-open code point range [lo, hi).
struct CodepointRange {
  char32_t lo;
  char32_t hi;
};

// Decodes the code point at s[i] of VALID UTF-8 and advances i past it.
inline char32_t next_codepoint(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  unsigned char b = p[0];
  if (b < 0x80) {
    i += 1;
    return b;
  }
  if (b < 0xE0) {
    i += 2;
    return (char32_t(b & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b < 0xF0) {
    i += 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  i += 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// Length in bytes of the (valid) UTF-8 sequence that starts with byte b.
inline size_t utf8_length(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void append_utf8(std::string& out, char32_t cp);

// The UTF-8 sequence at s[i]: a valid one of `length` bytes, or an invalid maximal subpart of `length` bytes (at
// least 1) that becomes one U+FFFD. `truncated` marks an invalid subpart that runs into the end of s and could still
// become valid if more bytes followed (a streaming decoder waits for them).
struct Utf8Step {
  size_t length;
  bool valid;
  bool truncated;
};
Utf8Step utf8_step(std::string_view s, size_t i);

bool is_valid_utf8(std::string_view s);
// Replaces each invalid maximal subpart with U+FFFD, exactly like Rust's String::from_utf8_lossy.
std::string to_valid_utf8(std::string_view s);

// Regex classes as HF's regex engine (Oniguruma) sees them.
bool is_letter(char32_t cp);  // \p{L}
bool is_number(char32_t cp);  // \p{N}
bool is_space(char32_t cp);   // \s (White_Space)
bool is_word(char32_t cp);    // \w of Rust's regex crate (single_word added tokens)

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
// Cheap test that text is certainly unchanged by the form: no code point from U+0300 on (NFC) or no non-ASCII
// (the others).
bool is_quick_normalized(std::string_view s, NormalForm form);
// Normalizes valid UTF-8 text the way HF's normalizers do (their Unicode 9 data: code points that are newer pass
// through unchanged).
std::string normalize(std::string_view s, NormalForm form);

}  // namespace moecel::unicode
