// Pre-tokenizer splitting: the Split pre-tokenizer of HuggingFace tokenizers (regex or literal pattern, the five
// delimiter behaviours, invert). The split regexes of GPT-2/ByteLevel, Qwen2 and Llama 3 are matched by hand-written
// code over Unicode classes; any other regex goes through PCRE2.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moecel::tok {

// The regex of HF's ByteLevel pre-tokenizer (GPT-2).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2 / Qwen3 split regex.
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3 split regex (numbers in groups of up to three digits).
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A span of the input: a match of the pattern or the gap between two matches.
struct Segment {
  uint32_t start;
  uint32_t end;
  bool is_match;
};

class Matcher {
 public:
  virtual ~Matcher() = default;
  // Appends segments covering all of s (valid UTF-8), like HF's Pattern::find_matches.
  virtual void find_matches(std::string_view s, std::vector<Segment>& out) const = 0;
};

// A regex matcher: hand-written for the known patterns unless force_pcre2, else PCRE2 (UTF, Unicode properties,
// JIT-compiled when available). Throws moecel::Error naming `origin` if PCRE2 rejects the pattern.
std::unique_ptr<Matcher> make_regex_matcher(const std::string& pattern, const std::string& origin,
                                            bool force_pcre2 = false);
// Matches every non-overlapping occurrence of a literal string.
std::unique_ptr<Matcher> make_literal_matcher(const std::string& literal);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class SplitStep {
 public:
  SplitStep(std::unique_ptr<Matcher> matcher, SplitBehavior behavior, bool invert);
  // Appends the non-empty pieces of `piece` to out (views into piece).
  void split(std::string_view piece, std::vector<std::string_view>& out) const;
  // The matcher, when this step is a plain isolated split by a hand-written pattern (the common case, which callers
  // can run without intermediate vectors).
  const class CoverMatcher* isolated_cover() const;

 private:
  std::unique_ptr<Matcher> matcher_;
  SplitBehavior behavior_;
  bool invert_;
};

// Hand-written matchers: their patterns match at every position, so they expose the end of the match that starts at
// i (always > i) for fast loops.
class CoverMatcher : public Matcher {
 public:
  virtual size_t match_end(std::string_view s, size_t i) const = 0;
  void find_matches(std::string_view s, std::vector<Segment>& out) const override;
};

}  // namespace moecel::tok
