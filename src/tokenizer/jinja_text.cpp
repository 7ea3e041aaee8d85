// UTF-8 and Python `str` helpers for the Jinja engine (see jinja_text.h). Case mapping and character
// categories come from utf8proc; Python uses its own Unicode tables, which agree for everything chat
// templates meet in practice (full case mappings such as 'ß'.upper() == 'SS' are the known exception).
#include "tokenizer/jinja_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <iterator>

namespace moecel::jinja::text {

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    int n = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    char32_t cp = n == 4 ? c & 0x07 : n == 3 ? c & 0x0F : c & 0x1F;
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF like a strict decoder does.
    if (ok &&
        ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (!ok) {
      out.push_back(0xDC00 + c);  // surrogateescape: keeps the byte
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {  // an escaped invalid byte
    out.push_back(static_cast<char>(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t length(std::string_view s) {
  return is_ascii(s) ? s.size() : decode(s).size();
}

size_t cp_index(std::string_view s, size_t byte_pos) {
  return length(s.substr(0, byte_pos));
}

bool is_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

static utf8proc_category_t category(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_cased(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

bool cp_is_digit(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_ND;
}
bool cp_is_alpha(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool cp_is_alnum(char32_t c) {
  return cp_is_alpha(c) || cp_is_digit(c) || category(c) == UTF8PROC_CATEGORY_NL;
}
bool cp_is_lower(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LL;
}
bool cp_is_upper(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LU || category(c) == UTF8PROC_CATEGORY_LT;
}

bool cp_is_ident_start(char32_t c) {
  return c == '_' || cp_is_alpha(c) || category(c) == UTF8PROC_CATEGORY_NL;
}

bool cp_is_ident_char(char32_t c) {
  auto k = category(c);
  return cp_is_ident_start(c) || k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NO || k == UTF8PROC_CATEGORY_MN ||
         k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_PC;
}

bool all_chars(std::string_view s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : decode(s))
    if (!pred(c)) return false;
  return true;
}

bool has_cased(std::string_view s, bool want_upper) {
  bool any = false;
  for (char32_t c : decode(s)) {
    if (!is_cased(c)) continue;
    bool up = cp_is_upper(c);
    if (up != want_upper) return false;
    any = true;
  }
  return any;
}

static char32_t to_upper(char32_t c) {
  return c > 0x10FFFF ? c : utf8proc_toupper(static_cast<utf8proc_int32_t>(c));
}
static char32_t to_lower(char32_t c) {
  return c > 0x10FFFF ? c : utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
}
static char32_t to_title(char32_t c) {
  return c > 0x10FFFF ? c : utf8proc_totitle(static_cast<utf8proc_int32_t>(c));
}

// Python's full case mappings where one character maps to several (SpecialCasing.txt, unconditional part);
// utf8proc only has the one-to-one mappings, which agree with Python's everywhere else.
struct MultiCase {
  char32_t cp;
  char32_t out[3];
};
// clang-format off
const MultiCase kUpperMulti[] = {
    {0xDF, {0x53, 0x53}}, {0x149, {0x2BC, 0x4E}}, {0x1F0, {0x4A, 0x30C}}, {0x390, {0x399, 0x308, 0x301}},
    {0x3B0, {0x3A5, 0x308, 0x301}}, {0x587, {0x535, 0x552}}, {0x1E96, {0x48, 0x331}}, {0x1E97, {0x54, 0x308}},
    {0x1E98, {0x57, 0x30A}}, {0x1E99, {0x59, 0x30A}}, {0x1E9A, {0x41, 0x2BE}}, {0x1F50, {0x3A5, 0x313}},
    {0x1F52, {0x3A5, 0x313, 0x300}}, {0x1F54, {0x3A5, 0x313, 0x301}}, {0x1F56, {0x3A5, 0x313, 0x342}},
    {0x1F80, {0x1F08, 0x399}}, {0x1F81, {0x1F09, 0x399}}, {0x1F82, {0x1F0A, 0x399}}, {0x1F83, {0x1F0B, 0x399}},
    {0x1F84, {0x1F0C, 0x399}}, {0x1F85, {0x1F0D, 0x399}}, {0x1F86, {0x1F0E, 0x399}}, {0x1F87, {0x1F0F, 0x399}},
    {0x1F88, {0x1F08, 0x399}}, {0x1F89, {0x1F09, 0x399}}, {0x1F8A, {0x1F0A, 0x399}}, {0x1F8B, {0x1F0B, 0x399}},
    {0x1F8C, {0x1F0C, 0x399}}, {0x1F8D, {0x1F0D, 0x399}}, {0x1F8E, {0x1F0E, 0x399}}, {0x1F8F, {0x1F0F, 0x399}},
    {0x1F90, {0x1F28, 0x399}}, {0x1F91, {0x1F29, 0x399}}, {0x1F92, {0x1F2A, 0x399}}, {0x1F93, {0x1F2B, 0x399}},
    {0x1F94, {0x1F2C, 0x399}}, {0x1F95, {0x1F2D, 0x399}}, {0x1F96, {0x1F2E, 0x399}}, {0x1F97, {0x1F2F, 0x399}},
    {0x1F98, {0x1F28, 0x399}}, {0x1F99, {0x1F29, 0x399}}, {0x1F9A, {0x1F2A, 0x399}}, {0x1F9B, {0x1F2B, 0x399}},
    {0x1F9C, {0x1F2C, 0x399}}, {0x1F9D, {0x1F2D, 0x399}}, {0x1F9E, {0x1F2E, 0x399}}, {0x1F9F, {0x1F2F, 0x399}},
    {0x1FA0, {0x1F68, 0x399}}, {0x1FA1, {0x1F69, 0x399}}, {0x1FA2, {0x1F6A, 0x399}}, {0x1FA3, {0x1F6B, 0x399}},
    {0x1FA4, {0x1F6C, 0x399}}, {0x1FA5, {0x1F6D, 0x399}}, {0x1FA6, {0x1F6E, 0x399}}, {0x1FA7, {0x1F6F, 0x399}},
    {0x1FA8, {0x1F68, 0x399}}, {0x1FA9, {0x1F69, 0x399}}, {0x1FAA, {0x1F6A, 0x399}}, {0x1FAB, {0x1F6B, 0x399}},
    {0x1FAC, {0x1F6C, 0x399}}, {0x1FAD, {0x1F6D, 0x399}}, {0x1FAE, {0x1F6E, 0x399}}, {0x1FAF, {0x1F6F, 0x399}},
    {0x1FB2, {0x1FBA, 0x399}}, {0x1FB3, {0x391, 0x399}}, {0x1FB4, {0x386, 0x399}}, {0x1FB6, {0x391, 0x342}},
    {0x1FB7, {0x391, 0x342, 0x399}}, {0x1FBC, {0x391, 0x399}}, {0x1FC2, {0x1FCA, 0x399}}, {0x1FC3, {0x397, 0x399}},
    {0x1FC4, {0x389, 0x399}}, {0x1FC6, {0x397, 0x342}}, {0x1FC7, {0x397, 0x342, 0x399}}, {0x1FCC, {0x397, 0x399}},
    {0x1FD2, {0x399, 0x308, 0x300}}, {0x1FD3, {0x399, 0x308, 0x301}}, {0x1FD6, {0x399, 0x342}},
    {0x1FD7, {0x399, 0x308, 0x342}}, {0x1FE2, {0x3A5, 0x308, 0x300}}, {0x1FE3, {0x3A5, 0x308, 0x301}},
    {0x1FE4, {0x3A1, 0x313}}, {0x1FE6, {0x3A5, 0x342}}, {0x1FE7, {0x3A5, 0x308, 0x342}}, {0x1FF2, {0x1FFA, 0x399}},
    {0x1FF3, {0x3A9, 0x399}}, {0x1FF4, {0x38F, 0x399}}, {0x1FF6, {0x3A9, 0x342}}, {0x1FF7, {0x3A9, 0x342, 0x399}},
    {0x1FFC, {0x3A9, 0x399}}, {0xFB00, {0x46, 0x46}}, {0xFB01, {0x46, 0x49}}, {0xFB02, {0x46, 0x4C}},
    {0xFB03, {0x46, 0x46, 0x49}}, {0xFB04, {0x46, 0x46, 0x4C}}, {0xFB05, {0x53, 0x54}}, {0xFB06, {0x53, 0x54}},
    {0xFB13, {0x544, 0x546}}, {0xFB14, {0x544, 0x535}}, {0xFB15, {0x544, 0x53B}}, {0xFB16, {0x54E, 0x546}},
    {0xFB17, {0x544, 0x53D}},
};
const MultiCase kTitleMulti[] = {
    {0xDF, {0x53, 0x73}}, {0x149, {0x2BC, 0x4E}}, {0x1F0, {0x4A, 0x30C}}, {0x390, {0x399, 0x308, 0x301}},
    {0x3B0, {0x3A5, 0x308, 0x301}}, {0x587, {0x535, 0x582}}, {0x1E96, {0x48, 0x331}}, {0x1E97, {0x54, 0x308}},
    {0x1E98, {0x57, 0x30A}}, {0x1E99, {0x59, 0x30A}}, {0x1E9A, {0x41, 0x2BE}}, {0x1F50, {0x3A5, 0x313}},
    {0x1F52, {0x3A5, 0x313, 0x300}}, {0x1F54, {0x3A5, 0x313, 0x301}}, {0x1F56, {0x3A5, 0x313, 0x342}},
    {0x1FB2, {0x1FBA, 0x345}}, {0x1FB4, {0x386, 0x345}}, {0x1FB6, {0x391, 0x342}}, {0x1FB7, {0x391, 0x342, 0x345}},
    {0x1FC2, {0x1FCA, 0x345}}, {0x1FC4, {0x389, 0x345}}, {0x1FC6, {0x397, 0x342}}, {0x1FC7, {0x397, 0x342, 0x345}},
    {0x1FD2, {0x399, 0x308, 0x300}}, {0x1FD3, {0x399, 0x308, 0x301}}, {0x1FD6, {0x399, 0x342}},
    {0x1FD7, {0x399, 0x308, 0x342}}, {0x1FE2, {0x3A5, 0x308, 0x300}}, {0x1FE3, {0x3A5, 0x308, 0x301}},
    {0x1FE4, {0x3A1, 0x313}}, {0x1FE6, {0x3A5, 0x342}}, {0x1FE7, {0x3A5, 0x308, 0x342}}, {0x1FF2, {0x1FFA, 0x345}},
    {0x1FF4, {0x38F, 0x345}}, {0x1FF6, {0x3A9, 0x342}}, {0x1FF7, {0x3A9, 0x342, 0x345}}, {0xFB00, {0x46, 0x66}},
    {0xFB01, {0x46, 0x69}}, {0xFB02, {0x46, 0x6C}}, {0xFB03, {0x46, 0x66, 0x69}}, {0xFB04, {0x46, 0x66, 0x6C}},
    {0xFB05, {0x53, 0x74}}, {0xFB06, {0x53, 0x74}}, {0xFB13, {0x544, 0x576}}, {0xFB14, {0x544, 0x565}},
    {0xFB15, {0x544, 0x56B}}, {0xFB16, {0x54E, 0x576}}, {0xFB17, {0x544, 0x56D}},
};
// clang-format on

template <size_t N>
static void append_mapped(std::u32string& out, char32_t c, const MultiCase (&table)[N], char32_t (*simple)(char32_t)) {
  if (c >= 0xDF) {
    const MultiCase* m = std::lower_bound(std::begin(table), std::end(table), c,
                                          [](const MultiCase& e, char32_t v) { return e.cp < v; });
    if (m != std::end(table) && m->cp == c) {
      for (char32_t o : m->out)
        if (o) out.push_back(o);
      return;
    }
  }
  out.push_back(simple(c));
}

static void append_lower(std::u32string& out, const std::u32string& u, size_t i) {
  char32_t c = u[i];
  if (c == 0x130) {  // İ lowers to i + combining dot above
    out.push_back('i');
    out.push_back(0x307);
  } else if (c == 0x3A3) {  // final sigma: after a cased letter and not before one
    bool after_cased = i > 0 && is_cased(u[i - 1]);
    bool before_cased = i + 1 < u.size() && is_cased(u[i + 1]);
    out.push_back(after_cased && !before_cased ? 0x3C2 : 0x3C3);
  } else {
    out.push_back(to_lower(c));
  }
}

std::string upper(std::string_view s) {
  std::u32string u = decode(s), out;
  for (char32_t c : u) append_mapped(out, c, kUpperMulti, to_upper);
  return encode(out);
}

std::string lower(std::string_view s) {
  std::u32string u = decode(s), out;
  for (size_t i = 0; i < u.size(); ++i) append_lower(out, u, i);
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s), out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0)
      append_mapped(out, u[i], kTitleMulti, to_title);
    else
      append_lower(out, u, i);
  }
  return encode(out);
}

std::string title_method(std::string_view s) {
  std::u32string u = decode(s), out;
  bool prev_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (prev_cased)
      append_lower(out, u, i);
    else
      append_mapped(out, u[i], kTitleMulti, to_title);
    prev_cased = is_cased(u[i]);
  }
  return encode(out);
}

std::string title_filter(std::string_view s) {
  // jinja2: "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", s) if w)
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c); };
  std::u32string u = decode(s), out;
  bool word_start = true;
  for (size_t i = 0; i < u.size(); ++i) {
    if (is_sep(u[i])) {
      out.push_back(u[i]);
      word_start = true;
    } else if (word_start) {
      append_mapped(out, u[i], kUpperMulti, to_upper);
      word_start = false;
    } else {
      append_lower(out, u, i);
    }
  }
  return encode(out);
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  if (!chars && is_ascii(s)) {  // fast path, the common case
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && is_space(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && is_space(static_cast<unsigned char>(s[e - 1]))) --e;
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = decode(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {  // the rest, trailing space kept
      out.push_back(encode(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    out.push_back(encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit && end >= sep->size()) {
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    std::u32string u = decode(s);
    size_t e = u.size();
    while (true) {
      while (e > 0 && is_space(u[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {  // the rest, leading space kept
        out.push_back(encode(std::u32string_view(u).substr(0, e)));
        break;
      }
      size_t b = e;
      while (b > 0 && !is_space(u[b - 1])) --b;
      out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
      e = b;
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  std::u32string u = decode(s);
  std::vector<std::string> out;
  size_t i = 0, start = 0;
  while (i < u.size()) {
    if (!is_break(u[i])) {
      ++i;
      continue;
    }
    size_t eol = i;
    i += (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ? 2 : 1;
    out.push_back(encode(std::u32string_view(u).substr(start, (keepends ? i : eol) - start)));
    start = i;
  }
  if (start < u.size()) out.push_back(encode(std::u32string_view(u).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` before every character and at the end
    std::u32string u = decode(s);
    int64_t n = 0;
    for (char32_t c : u) {
      if (count < 0 || n < count) out += repl, ++n;
      append_utf8(out, c);
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(repl);
    pos = f + old.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  static const char* kHex = "0123456789abcdef";
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x80 ? (c < 0x20 || c == 0x7F) : !is_printable(c)) {
      int digits = c < 0x100 ? 2 : c < 0x10000 ? 4 : 8;
      out += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
      for (int k = digits - 1; k >= 0; --k) out.push_back(kHex[(c >> (4 * k)) & 0xF]);
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace moecel::jinja::text
