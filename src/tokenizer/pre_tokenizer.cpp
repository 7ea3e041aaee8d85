// Split pre-tokenizer (see pre_tokenizer.h). The hand-written matchers follow the regexes' alternation order and
// backtracking exactly; PCRE2 is the fallback for other patterns and the oracle in the tests.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moecel::tok {

namespace {

enum Cls : uint8_t { kOther, kLetter, kNumber, kSpace };

constexpr std::array<uint8_t, 128> make_ascii_classes() {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      t[c] = kLetter;
    else if (c >= '0' && c <= '9')
      t[c] = kNumber;
    else if (c == ' ' || (c >= 0x09 && c <= 0x0D))
      t[c] = kSpace;
    else
      t[c] = kOther;
  }
  return t;
}
constexpr std::array<uint8_t, 128> kAsciiClasses = make_ascii_classes();

struct CharInfo {
  char32_t cp;
  uint32_t len;
  uint8_t cls;
};

inline CharInfo char_at(std::string_view s, size_t i) {
  unsigned char b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {b, 1, kAsciiClasses[b]};
  size_t j = i;
  char32_t cp = unicode::next_codepoint(s, j);
  uint8_t cls = unicode::is_letter(cp)   ? kLetter
                : unicode::is_number(cp) ? kNumber
                : unicode::is_space(cp)  ? kSpace
                                         : kOther;
  return {cp, uint32_t(j - i), cls};
}

// End of the run of characters of class `cls` starting at i.
inline size_t run_end(std::string_view s, size_t i, uint8_t cls) {
  const size_t n = s.size();
  while (i < n) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      if (kAsciiClasses[b] != cls) break;
      ++i;
      continue;
    }
    CharInfo c = char_at(s, i);
    if (c.cls != cls) break;
    i += c.len;
  }
  return i;
}

// The whitespace run starting at i: its end, the start of its last character and of its last CR/LF.
struct SpaceRun {
  size_t end, last, last_crlf;
};
inline SpaceRun space_run(std::string_view s, size_t i) {
  SpaceRun r{i, i, std::string_view::npos};
  while (r.end < s.size()) {
    CharInfo c = char_at(s, r.end);
    if (c.cls != kSpace) break;
    if (c.cp == '\r' || c.cp == '\n') r.last_crlf = r.end;
    r.last = r.end;
    r.end += c.len;
  }
  return r;
}

// 's|'t|'re|'ve|'m|'ll|'d at i (s[i] == '\''): the match end, or 0.
inline size_t contraction_end(std::string_view s, size_t i, bool ignore_case) {
  auto lower = [&](size_t k) -> char {
    char c = s[k];
    return ignore_case && c >= 'A' && c <= 'Z' ? char(c | 0x20) : c;
  };
  if (i + 1 >= s.size()) return 0;
  char c1 = lower(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
  if (i + 2 >= s.size()) return 0;
  char c2 = lower(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
class Gpt2Matcher : public CoverMatcher {
 public:
  size_t match_end(std::string_view s, size_t i) const override {
    const size_t n = s.size();
    const char b = s[i];
    if (b == '\'') {
      if (size_t e = contraction_end(s, i, false)) return e;
    }
    if (b == ' ' && i + 1 < n) {
      CharInfo c1 = char_at(s, i + 1);
      if (c1.cls != kSpace) return run_end(s, i + 1 + c1.len, c1.cls);
    }
    CharInfo c0 = char_at(s, i);
    if (c0.cls != kSpace) return run_end(s, i + c0.len, c0.cls);
    // \s+(?!\S) backtracks one character when the run is followed by a non-space; a lone one falls to \s+.
    SpaceRun r = space_run(s, i);
    if (r.end == n || r.last == i) return r.end;
    return r.last;
  }
};

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
class Qwen2Matcher : public CoverMatcher {
 public:
  explicit Qwen2Matcher(int max_digits) : max_digits_(max_digits) {}
  size_t match_end(std::string_view s, size_t i) const override {
    const size_t n = s.size();
    const char b = s[i];
    if (b == '\'') {
      if (size_t e = contraction_end(s, i, true)) return e;
    }
    CharInfo c0 = char_at(s, i);
    if (c0.cls == kLetter) return run_end(s, i + c0.len, kLetter);
    if (c0.cls != kNumber && b != '\r' && b != '\n' && i + c0.len < n) {
      CharInfo c1 = char_at(s, i + c0.len);
      if (c1.cls == kLetter) return run_end(s, i + c0.len + c1.len, kLetter);
    }
    if (c0.cls == kNumber) {
      size_t j = i + c0.len;
      for (int k = 1; k < max_digits_ && j < n; ++k) {
        CharInfo c = char_at(s, j);
        if (c.cls != kNumber) break;
        j += c.len;
      }
      return j;
    }
    size_t other_start = std::string_view::npos;
    if (b == ' ' && i + 1 < n && char_at(s, i + 1).cls == kOther)
      other_start = i + 1;
    else if (c0.cls == kOther)
      other_start = i;
    if (other_start != std::string_view::npos) {
      size_t j = run_end(s, other_start, kOther);
      while (j < n && (s[j] == '\r' || s[j] == '\n')) ++j;
      return j;
    }
    // Whitespace. \s*[\r\n]+ ends after the run's last CR/LF; else \s+(?!\S) and \s+ as in GPT-2.
    SpaceRun r = space_run(s, i);
    if (r.last_crlf != std::string_view::npos) return r.last_crlf + 1;
    if (r.end == n || r.last == i) return r.end;
    return r.last;
  }

 private:
  int max_digits_;
};

class Pcre2Matcher : public Matcher {
 public:
  Pcre2Matcher(const std::string& pattern, const std::string& origin) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      fail("{}: split regex '{}' is not supported (PCRE2 error at offset {}: {})", origin, pattern, offset,
           reinterpret_cast<const char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Pcre2Matcher() override { pcre2_code_free(code_); }

  void find_matches(std::string_view s, std::vector<Segment>& out) const override {
    const size_t n = s.size();
    if (n == 0) {
      out.push_back({0, 0, false});
      return;
    }
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t prev = 0, pos = 0;
    while (pos <= n) {
      int rc = jit_ ? pcre2_jit_match(code_, subject, n, pos, 0, md, nullptr)
                    : pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t ms = ov[0], me = ov[1];
      if (prev != ms) out.push_back({uint32_t(prev), uint32_t(ms), false});
      out.push_back({uint32_t(ms), uint32_t(me), true});
      prev = me;
      if (me > ms) {
        pos = me;
      } else {
        if (ms >= n) break;
        pos = ms + unicode::utf8_length(static_cast<unsigned char>(s[ms]));  // step over an empty match
      }
    }
    if (prev != n) out.push_back({uint32_t(prev), uint32_t(n), false});
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

class LiteralMatcher : public Matcher {
 public:
  explicit LiteralMatcher(std::string literal) : literal_(std::move(literal)) {}
  void find_matches(std::string_view s, std::vector<Segment>& out) const override {
    if (literal_.empty() || s.empty()) {
      out.push_back({0, uint32_t(s.size()), false});
      return;
    }
    size_t prev = 0;
    for (size_t pos = s.find(literal_); pos != std::string_view::npos; pos = s.find(literal_, pos)) {
      if (prev != pos) out.push_back({uint32_t(prev), uint32_t(pos), false});
      out.push_back({uint32_t(pos), uint32_t(pos + literal_.size()), true});
      pos += literal_.size();
      prev = pos;
    }
    if (prev != s.size()) out.push_back({uint32_t(prev), uint32_t(s.size()), false});
  }

 private:
  std::string literal_;
};

}  // namespace

void CoverMatcher::find_matches(std::string_view s, std::vector<Segment>& out) const {
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  for (size_t i = 0; i < s.size();) {
    size_t e = match_end(s, i);
    out.push_back({uint32_t(i), uint32_t(e), true});
    i = e;
  }
}

std::unique_ptr<Matcher> make_regex_matcher(const std::string& pattern, const std::string& origin, bool force_pcre2) {
  if (!force_pcre2) {
    if (pattern == kGpt2Pattern) return std::make_unique<Gpt2Matcher>();
    if (pattern == kQwen2Pattern) return std::make_unique<Qwen2Matcher>(1);
    if (pattern == kLlama3Pattern) return std::make_unique<Qwen2Matcher>(3);
  }
  return std::make_unique<Pcre2Matcher>(pattern, origin);
}

std::unique_ptr<Matcher> make_literal_matcher(const std::string& literal) {
  return std::make_unique<LiteralMatcher>(literal);
}

SplitStep::SplitStep(std::unique_ptr<Matcher> matcher, SplitBehavior behavior, bool invert)
    : matcher_(std::move(matcher)), behavior_(behavior), invert_(invert) {}

const CoverMatcher* SplitStep::isolated_cover() const {
  if (behavior_ != SplitBehavior::kIsolated || invert_) return nullptr;
  return dynamic_cast<const CoverMatcher*>(matcher_.get());
}

void SplitStep::split(std::string_view piece, std::vector<std::string_view>& out) const {
  thread_local std::vector<Segment> segs;
  segs.clear();
  matcher_->find_matches(piece, segs);
  if (invert_)
    for (Segment& s : segs) s.is_match = !s.is_match;
  // (start, end, removed) per HF's NormalizedString::split.
  thread_local std::vector<Segment> parts;
  parts.clear();
  bool previous_match = false;
  switch (behavior_) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : segs) parts.push_back({s.start, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segs) parts.push_back({s.start, s.end, s.is_match});
      break;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segs) {
        if (s.is_match == previous_match && !parts.empty())
          parts.back().end = s.end;
        else
          parts.push_back({s.start, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segs) {
        if (s.is_match && !previous_match && !parts.empty())
          parts.back().end = s.end;
        else
          parts.push_back({s.start, s.end, false});
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = segs.size(); k-- > 0;) {
        const Segment& s = segs[k];
        if (s.is_match && !previous_match && !parts.empty())
          parts.back().start = s.start;
        else
          parts.push_back({s.start, s.end, false});
        previous_match = s.is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
  }
  for (const Segment& p : parts) {
    // In `parts`, is_match means "removed".
    if (!p.is_match && p.end > p.start) out.push_back(piece.substr(p.start, p.end - p.start));
  }
}

}  // namespace moecel::tok
