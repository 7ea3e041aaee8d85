// Jinja lexer (see jinja_lexer.h). Mirrors jinja2.lexer.Lexer.tokeniter: the root rule finds the next
// `{{`, `{%`, `{#` (or `{% raw %}`), applies the strip sign / lstrip_blocks to the text before it, then the
// tag's tokens run until its end marker, which is only recognised while brackets are balanced.
#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/jinja_text.h"

namespace moecel::jinja {
namespace {

// Byte length of the whitespace character (Python `\s`) at `pos`, or 0.
size_t space_len(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return text::is_space(c) ? 1 : 0;
  size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  if (pos + n > s.size()) return 0;
  std::u32string u = text::decode(s.substr(pos, n));
  return u.size() == 1 && text::is_space(u[0]) ? n : 0;
}

size_t skip_spaces(std::string_view s, size_t pos) {
  while (size_t n = space_len(s, pos)) pos += n;
  return pos;
}

bool all_space(std::string_view s) {
  return !s.empty() && skip_spaces(s, 0) == s.size();
}

int count_newlines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& opt) : src_(std::move(src)), opt_(opt) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_data(src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, tag - pos_);
      char kind = src_[tag + 1];
      size_t p = tag + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      size_t raw_end = kind == '%' ? match_raw_begin(p) : 0;
      emit_data(strip_before(text, sign, kind != '{'));
      line_ += count_newlines(text);
      pos_ = p;
      if (raw_end) {
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind);
      }
    }
    out_.push_back(Token{Tok::kEof, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(int line, const std::string& msg) const { fail("template line {}: {}", line, msg); }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // The text before a tag after `{%-` (strip all trailing whitespace) or lstrip_blocks (drop an indent
  // that is the only thing between the line start and a block or comment tag).
  std::string strip_before(std::string text, char sign, bool block_or_comment) const {
    if (sign == '-') return text::strip(text, nullptr, false, true);
    if (sign != '+' && opt_.lstrip_blocks && block_or_comment) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
    }
    return text;
  }

  void emit_data(std::string text) {
    if (!text.empty()) out_.push_back(Token{Tok::kData, std::move(text), line_});
  }

  // After `{%` and its sign: `\s*raw\s*(-%}\s*|%})`; returns the position after it, or 0.
  size_t match_raw_begin(size_t p) const {
    p = skip_spaces(src_, p);
    if (src_.compare(p, 3, "raw") != 0) return 0;
    p = skip_spaces(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_spaces(src_, p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return 0;
  }

  // Block end at `p`: returns the position after it (with trim_blocks / `-` applied), or 0.
  size_t match_block_end(size_t p, const char* close) const {
    size_t n = std::char_traits<char>::length(close);
    if (close[0] == '%' && src_[p] == '+' && src_.compare(p + 1, n, close) == 0) return p + 1 + n;
    if (src_[p] == '-' && src_.compare(p + 1, n, close) == 0) return skip_spaces(src_, p + 1 + n);
    if (src_.compare(p, n, close) == 0) {
      size_t e = p + n;
      if (close[0] != '}' && opt_.trim_blocks && e < src_.size() && src_[e] == '\n') ++e;
      return e;
    }
    return 0;
  }

  void finish_match(size_t end) {
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end;
  }

  void lex_raw(size_t body_start) {
    int start_line = line_;
    finish_match(body_start);
    if (pos_ >= src_.size()) return;  // like an unclosed comment, accepted when nothing follows
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = skip_spaces(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = skip_spaces(src_, p + 6);
      size_t end = p < src_.size() ? match_block_end(p, "%}") : 0;
      if (!end) continue;
      std::string body = src_.substr(pos_, i - pos_);
      emit_data(strip_before(body, sign, true));
      finish_match(end);
      return;
    }
    error(start_line, "missing end of raw directive ({% endraw %})");
  }

  void lex_comment() {
    int start_line = line_;
    if (pos_ >= src_.size()) return;  // jinja2 quietly accepts a comment opener as the very last thing
    size_t f = src_.find("#}", pos_);
    if (f == std::string::npos) error(start_line, "missing end of comment tag ('#}')");
    size_t end;
    if (f > pos_ && src_[f - 1] == '-')
      end = skip_spaces(src_, f + 2);
    else if (f > pos_ && src_[f - 1] == '+')
      end = f + 2;
    else
      end = (opt_.trim_blocks && f + 2 < src_.size() && src_[f + 2] == '\n') ? f + 3 : f + 2;
    finish_match(end);
  }

  void lex_tag(char kind) {
    bool block = kind == '%';
    out_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, block ? "{%" : "{{", line_});
    std::vector<char> balance;
    while (true) {
      if (pos_ >= src_.size())
        error(line_, block ? "unexpected end of template: missing '%}'" : "unexpected end of template: missing '}}'");
      if (balance.empty()) {
        size_t end = match_block_end(pos_, block ? "%}" : "}}");
        if (end) {
          out_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, block ? "%}" : "}}", line_});
          finish_match(end);
          return;
        }
      }
      if (size_t ws = skip_spaces(src_, pos_); ws > pos_) {
        finish_match(ws);
        continue;
      }
      Token t{Tok::kOp, "", line_};
      size_t end = lex_number(t);
      if (!end) end = lex_name(t);
      if (!end) end = lex_string(t);
      if (!end) end = lex_operator(t, balance);
      out_.push_back(std::move(t));
      finish_match(end);
    }
  }

  // The code point at `p` and its byte length (0 at the end).
  std::pair<char32_t, size_t> code_point(size_t p) const {
    if (p >= src_.size()) return {0, 0};
    unsigned char c = static_cast<unsigned char>(src_[p]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    std::u32string u = text::decode(std::string_view(src_).substr(p, std::min(n, src_.size() - p)));
    return u.size() == 1 ? std::pair{u[0], n} : std::pair{u[0], size_t(1)};  // an invalid byte stands alone
  }

  // Names are Python identifiers: letters, digits, '_' and combining marks, Unicode included.
  size_t lex_name(Token& t) const {
    auto is_name_char = [](char32_t c) {
      if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      return c < 0xDC80 || c > 0xDCFF ? text::cp_is_ident_char(c) : false;
    };
    size_t e = pos_;
    while (true) {
      auto [c, n] = code_point(e);
      if (!n || !is_name_char(c)) break;
      e += n;
    }
    if (e == pos_) return 0;
    char32_t first = code_point(pos_).first;
    if (!(first == '_' || text::cp_is_alpha(first) || (first >= 0x80 && text::cp_is_ident_start(first))))
      error(line_, "invalid character in identifier '" + src_.substr(pos_, e - pos_) + "'");
    t.type = Tok::kName;
    t.text = src_.substr(pos_, e - pos_);
    return e;
  }

  // Digits with single underscores between them (Python's `(\d+_)*\d+`); returns the end or `p` when none.
  size_t digits(size_t p) const {
    size_t e = p;
    while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
      ++e;
      if (e + 1 < src_.size() && src_[e] == '_' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) ++e;
    }
    return e;
  }

  size_t lex_number(Token& t) {
    size_t p = pos_;
    if (!std::isdigit(static_cast<unsigned char>(src_[p]))) return 0;
    auto clean = [&](size_t b, size_t e) {
      std::string s = src_.substr(b, e - b);
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    // Float: digits then a fraction and/or exponent; never right after '.' (so `x.0.1` is x[0][1]).
    if (p == 0 || src_[p - 1] != '.') {
      size_t e = digits(p);
      size_t f = e;
      bool frac = false, expo = false;
      if (f + 1 < src_.size() && src_[f] == '.' && std::isdigit(static_cast<unsigned char>(src_[f + 1]))) {
        f = digits(f + 1);
        frac = true;
      }
      if (f < src_.size() && (src_[f] == 'e' || src_[f] == 'E')) {
        size_t x = f + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
          f = digits(x);
          expo = true;
        }
      }
      if (frac || expo) {
        t.type = Tok::kFloat;
        t.fval = std::strtod(clean(p, f).c_str(), nullptr);
        t.text = src_.substr(p, f - p);
        return f;
      }
    }
    int base = 10;
    size_t b = p, e;
    char x = p + 1 < src_.size() ? static_cast<char>(std::tolower(static_cast<unsigned char>(src_[p + 1]))) : 0;
    if (src_[p] == '0' && (x == 'b' || x == 'o' || x == 'x')) {
      base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
      auto ok = [&](char c) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0 : c >= '0' && c < '0' + base;
      };
      b = e = p + 2;
      while (e < src_.size() && (ok(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && ok(src_[e + 1])))) ++e;
      if (e == b) error(line_, "invalid integer literal");
    } else if (src_[p] == '0') {
      e = p + 1;
      while (e < src_.size() && (src_[e] == '0' || (src_[e] == '_' && e + 1 < src_.size() && src_[e + 1] == '0'))) ++e;
    } else {
      e = digits(p);
    }
    std::string s = clean(b, e);
    errno = 0;
    char* endp = nullptr;
    long long v = std::strtoll(s.c_str(), &endp, base);
    if (errno == ERANGE) error(line_, "integer literal " + src_.substr(p, e - p) + " is too large");
    t.type = Tok::kInt;
    t.ival = v;
    t.text = src_.substr(p, e - p);
    return e;
  }

  size_t lex_string(Token& t) {
    char q = src_[pos_];
    if (q != '\'' && q != '"') return 0;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) error(line_, "unterminated string literal");
      char c = src_[i];
      if (c == q) break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) error(line_, "unterminated string literal");
      i = unescape(i + 1, out);
    }
    t.type = Tok::kString;
    t.text = std::move(out);
    return i + 1;
  }

  // Python's "unicode-escape" decoding of the escape whose letter is at `i`; returns the position after it.
  size_t unescape(size_t i, std::string& out) {
    char c = src_[i];
    switch (c) {
      case '\n': return i + 1;  // line continuation
      case '\\': out.push_back('\\'); return i + 1;
      case '\'': out.push_back('\''); return i + 1;
      case '"': out.push_back('"'); return i + 1;
      case 'a': out.push_back('\a'); return i + 1;
      case 'b': out.push_back('\b'); return i + 1;
      case 'f': out.push_back('\f'); return i + 1;
      case 'n': out.push_back('\n'); return i + 1;
      case 'r': out.push_back('\r'); return i + 1;
      case 't': out.push_back('\t'); return i + 1;
      case 'v': out.push_back('\v'); return i + 1;
      default: break;
    }
    if (c >= '0' && c <= '7') {
      unsigned v = 0;
      size_t e = i;
      while (e < i + 3 && e < src_.size() && src_[e] >= '0' && src_[e] <= '7') v = v * 8 + (src_[e++] - '0');
      text::append_utf8(out, v);
      return e;
    }
    if (c == 'x' || c == 'u' || c == 'U') {
      size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      if (i + n >= src_.size()) error(line_, std::string("truncated \\") + c + " escape in string literal");
      std::string hex = src_.substr(i + 1, n);
      if (!std::all_of(hex.begin(), hex.end(), [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); }))
        error(line_, std::string("truncated \\") + c + " escape in string literal");
      unsigned long v = std::strtoul(hex.c_str(), nullptr, 16);
      if (v > 0x10FFFF) error(line_, "\\U escape out of range in string literal");
      text::append_utf8(out, static_cast<char32_t>(v));
      return i + 1 + n;
    }
    if (c == 'N') error(line_, "\\N{...} escapes are not supported in string literals");
    out.push_back('\\');  // unknown escapes stay as written
    return i;
  }

  size_t lex_operator(Token& t, std::vector<char>& balance) {
    static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                 "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      size_t n = std::char_traits<char>::length(op);
      if (src_.compare(pos_, n, op) != 0) continue;
      char c = op[0];
      if (n == 1 && (c == '(' || c == '[' || c == '{')) {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (n == 1 && (c == ')' || c == ']' || c == '}')) {
        if (balance.empty()) error(line_, std::string("unexpected '") + c + "'");
        if (balance.back() != c) error(line_, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
        balance.pop_back();
      }
      t.type = Tok::kOp;
      t.text = op;
      return pos_ + n;
    }
    std::u32string u = text::decode(std::string_view(src_).substr(pos_, 4));
    error(line_, "unexpected character " + text::repr(text::encode(std::u32string(1, u.empty() ? U'?' : u[0]))));
  }

  std::string src_;
  LexOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& opt) {
  // Newlines are normalised to "\n" and, like jinja2, one trailing newline is dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!opt.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), opt).run();
}

}  // namespace moecel::jinja
