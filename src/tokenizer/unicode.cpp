// UTF-8 handling, regex character classes and normalization for the tokenizer (see unicode.h).
#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moecel::unicode {

// Generated tables (unicode_tables.cpp).
extern const CodepointRange kExtraLetters[];
extern const size_t kExtraLettersSize;
extern const CodepointRange kExtraNumbers[];
extern const size_t kExtraNumbersSize;
extern const CodepointRange kNormalizationPassthrough[];
extern const size_t kNormalizationPassthroughSize;

namespace {

bool in_ranges(const CodepointRange* ranges, size_t n, char32_t cp) {
  const CodepointRange* end = ranges + n;
  const CodepointRange* it =
      std::upper_bound(ranges, end, cp, [](char32_t c, const CodepointRange& r) { return c < r.hi; });
  return it != end && it->lo <= cp;
}

bool is_cont(unsigned char b) {
  return (b & 0xC0) == 0x80;
}

}  // namespace

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  unsigned char b = p[i];
  if (b < 0x80) return {1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};
  }
  // Walk the continuation bytes; the maximal subpart ends at the first byte that cannot continue the sequence.
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= n) return {k, false, true};
    unsigned char c = p[i + k];
    bool ok = k == 1 ? (c >= lo && c <= hi) : is_cont(c);
    if (!ok) return {k, false, false};
  }
  return {need + 1, true, false};
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t v;
      std::memcpy(&v, s.data() + i, 8);
      if (v & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Step st = utf8_step(s, i);
    if (!st.valid) return false;
    i += st.length;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    Utf8Step st = utf8_step(s, i);
    if (st.valid) {
      out.append(s.data() + i, st.length);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += st.length;
  }
  return out;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(cp));
  if (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) return true;
  return cat == UTF8PROC_CATEGORY_CN && in_ranges(kExtraLetters, kExtraLettersSize, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(cp));
  if (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) return true;
  return cat == UTF8PROC_CATEGORY_CN && in_ranges(kExtraNumbers, kExtraNumbersSize, cp);
}

bool is_space(char32_t cp) {
  // White_Space is exactly Zs, Zl, Zp plus U+0009..U+000D and U+0085.
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  if (cp == 0x85) return true;
  utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_word(char32_t cp) {
  // Alphabetic, marks, decimal digits, connector punctuation and joiners; Other_Alphabetic symbols are the circled
  // and squared Latin letters.
  if (cp < 0x80) return is_letter(cp) || is_number(cp) || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
      (cp >= 0x1F170 && cp <= 0x1F189))
    return true;
  utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(cp));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return true;
    default:
      // Letters and digits newer than utf8proc's data (Rust's regex knows them).
      return cat == UTF8PROC_CATEGORY_CN &&
             (in_ranges(kExtraLetters, kExtraLettersSize, cp) || in_ranges(kExtraNumbers, kExtraNumbersSize, cp));
  }
}

namespace {

void normalize_segment(std::string_view s, NormalForm form, std::string& out) {
  if (s.empty()) return;
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                    &mapped, utf8proc_option_t(options));
  if (n < 0) fail("unicode normalization failed: {}", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(mapped), size_t(n));
  std::free(mapped);
}

}  // namespace

bool is_quick_normalized(std::string_view s, NormalForm form) {
  // Below U+0300 nothing changes under NFC (no marks, no singletons): those are the code points whose UTF-8 bytes
  // are all below 0xCC. The other forms change Latin-1 already.
  const unsigned char limit = form == NormalForm::kNFC ? 0xCC : 0x80;
  for (unsigned char b : s)
    if (b >= limit) return false;
  return true;
}

std::string normalize(std::string_view s, NormalForm form) {
  if (is_quick_normalized(s, form)) return std::string(s);
  const char32_t passthrough_min = kNormalizationPassthroughSize ? kNormalizationPassthrough[0].lo : 0x110000;
  bool has_passthrough = false;
  for (size_t i = 0; i < s.size() && !has_passthrough;) {
    char32_t cp = next_codepoint(s, i);
    has_passthrough = cp >= passthrough_min && in_ranges(kNormalizationPassthrough, kNormalizationPassthroughSize, cp);
  }
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  if (!has_passthrough) {
    normalize_segment(s, form, out);
    return out;
  }
  // HF's normalizer does not know these code points: they stay as they are and, being starters that compose with
  // nothing, separate the text into independently normalized segments.
  size_t seg = 0;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    char32_t cp = next_codepoint(s, i);
    if (cp >= passthrough_min && in_ranges(kNormalizationPassthrough, kNormalizationPassthroughSize, cp)) {
      normalize_segment(s.substr(seg, start - seg), form, out);
      out.append(s.substr(start, i - start));
      seg = i;
    }
  }
  normalize_segment(s.substr(seg), form, out);
  return out;
}

}  // namespace moecel::unicode
