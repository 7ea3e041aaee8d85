// Unicode layer of the tokenizer: regex classes and normalization over every code point against HuggingFace's
// (tests/golden/tokenizer/unicode.json), lossy UTF-8 repair, and the hand-written split regexes against PCRE2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kUnicodeGolden = fs::path(MOECEL_SOURCE_DIR) / "tests" / "golden" / "tokenizer" / "unicode.json";

json load_unicode_golden() {
  std::ifstream f(kUnicodeGolden);
  EXPECT_TRUE(f.good()) << "cannot open " << kUnicodeGolden;
  return json::parse(f);
}

TEST(TokenizerUnicode, RegexClassesMatchHuggingFaceForEveryCodePoint) {
  const json g = load_unicode_golden();
  const json& classes = g["classes"];
  std::vector<uint8_t> want(0x110000, 0);
  for (const auto& [name, bit] : {std::pair{"L", 1}, std::pair{"N", 2}, std::pair{"S", 4}})
    for (const json& r : classes[name])
      for (char32_t c = r[0]; c < r[1].get<char32_t>(); ++c) want[c] |= uint8_t(bit);
  int mismatches = 0;
  for (const json& range : g["normalization"]["ranges"]) {
    for (char32_t c = range[0]; c < range[1].get<char32_t>() && mismatches < 20; ++c) {
      if (c >= 0xD800 && c < 0xE000) continue;
      uint8_t got = (unicode::is_letter(c) ? 1 : 0) | (unicode::is_number(c) ? 2 : 0) | (unicode::is_space(c) ? 4 : 0);
      if (got != want[c]) {
        ADD_FAILURE() << "U+" << std::hex << uint32_t(c) << ": classes " << int(got) << ", HF " << int(want[c]);
        ++mismatches;
      }
    }
  }
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char b : s) {
    h ^= b;
    h *= 0x100000001B3ull;
  }
  return h;
}

TEST(TokenizerUnicode, NormalizationMatchesHuggingFaceForEveryCodePoint) {
  // Each code point alone, after a base letter and around marks of several combining classes (the probes of
  // tokenizer_goldens.py), normalized block by block and hashed.
  const json g = load_unicode_golden()["normalization"];
  const uint32_t block = g["block"];
  const std::string base = g["base"];
  std::vector<std::string> marks = g["marks"];
  const std::pair<const char*, unicode::NormalForm> forms[] = {{"NFC", unicode::NormalForm::kNFC},
                                                               {"NFD", unicode::NormalForm::kNFD},
                                                               {"NFKC", unicode::NormalForm::kNFKC},
                                                               {"NFKD", unicode::NormalForm::kNFKD}};
  int mismatches = 0;
  for (const auto& [bstr, unused] : g["NFC"].items()) {
    const uint32_t b = uint32_t(std::stoul(bstr));
    std::string text;
    for (char32_t c = b * block; c < (b + 1) * block; ++c) {
      if (c >= 0xD800 && c < 0xE000) continue;
      std::string ch;
      unicode::append_utf8(ch, c);
      auto seg = [&](const std::string& s) {
        if (!text.empty()) text += '\n';
        text += s;
      };
      seg(ch);
      seg(base + ch);
      for (const std::string& m : marks) {
        seg(base + ch + m);
        seg(base + m + ch);
      }
    }
    for (const auto& [name, form] : forms) {
      char hex[17];
      snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a64(unicode::normalize(text, form))));
      if (g[name][bstr].get<std::string>() != hex && mismatches++ < 20)
        ADD_FAILURE() << name << " differs from HF in code points U+" << std::hex << b * block << "..U+"
                      << (b + 1) * block - 1;
    }
  }
}

TEST(TokenizerUnicode, LossyRepairReplacesMaximalSubparts) {
  // Expected values follow the Unicode "maximal subpart" practice that Rust's from_utf8_lossy implements.
  const std::string r = "\xEF\xBF\xBD";
  const std::pair<std::string, std::string> cases[] = {
      {"abc", "abc"},
      {"\xC3\xA9", "\xC3\xA9"},
      {"\xFF", r},
      {"\x80\x80", r + r},
      {"\xE2\x82", r},  // truncated 3-byte sequence: one replacement
      {"\xE2\x82"
       "a",
       r + "a"},
      {"\xF0\x9F\x98", r},
      {"\xF0\x9F\x98"
       "\xF0\x9F\x98\x80",
       r + "\xF0\x9F\x98\x80"},
      {"\xC0\xAF", r + r},                  // overlong lead byte
      {"\xE0\x80\xAF", r + r + r},          // overlong 3-byte form
      {"\xED\xA0\x80", r + r + r},          // surrogate
      {"\xF4\x90\x80\x80", r + r + r + r},  // above U+10FFFF
      {"\xF5\x80", r + r},
      {"a\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", "a" + r + r + r + r + "A"},
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(unicode::to_valid_utf8(in), want);
    EXPECT_EQ(unicode::is_valid_utf8(in), in == want);
  }
}

// Random strings from characters PCRE2 10.42 (Unicode 14) classifies like HF: ASCII, whitespace of all kinds,
// letters, marks, digits and symbols from many scripts, emoji; not U+180E nor anything newer than Unicode 14, and
// not U+017F (PCRE2's (?i) matches "'\u017F" as "'s", Oniguruma's does not).
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> pool = {"a",
                                                "b",
                                                "Z",
                                                "s",
                                                "t",
                                                "re",
                                                "ve",
                                                "m",
                                                "ll",
                                                "d",
                                                "S",
                                                "T",
                                                "LL",
                                                "'",
                                                "'",
                                                "0",
                                                "7",
                                                " ",
                                                " ",
                                                " ",
                                                "\t",
                                                "\n",
                                                "\r",
                                                "\r\n",
                                                "\x0b",
                                                "\x0c",
                                                ".",
                                                ",",
                                                "!",
                                                "?",
                                                "-",
                                                "_",
                                                "(",
                                                "\"",
                                                "\xC2\xA0",
                                                "\xC2\x85",
                                                "\xE3\x80\x80",
                                                "\xE2\x80\xA8",
                                                "\xE2\x80\x89",
                                                "\xC3\xA9",
                                                "e\xCC\x81",
                                                "\xCC\x81",
                                                "\xE4\xB8\xAD",
                                                "\xD0\x96",
                                                "\xD7\x90",
                                                "\xD8\xA7",
                                                "\xE0\xA4\x95\xE0\xA5\x8D",
                                                "\xD9\xA3",
                                                "\xE2\x85\xA7",
                                                "\xC2\xBD",
                                                "\xC2\xB2",
                                                "\xF0\x9F\x98\x80",
                                                "\xF0\x9F\x8F\xBD",
                                                "\xE2\x80\x8D",
                                                "\xE2\x82\xAC",
                                                "\xEF\xAC\x81",
                                                "\xF0\x90\x8C\xB0",
                                                "\xF0\x9D\x9F\x8E",
                                                "\xE2\x80\x8B"};
  std::uniform_int_distribution<int> len(0, 40), pick(0, int(pool.size()) - 1);
  std::string s;
  for (int n = len(rng); n > 0; --n) s += pool[pick(rng)];
  return s;
}

TEST(TokenizerUnicode, HandWrittenSplittersAgreeWithPcre2) {
  for (std::string_view pattern : {tok::kGpt2Pattern, tok::kQwen2Pattern, tok::kLlama3Pattern}) {
    auto fast = tok::make_regex_matcher(std::string(pattern), "test");
    auto oracle = tok::make_regex_matcher(std::string(pattern), "test", /*force_pcre2=*/true);
    std::mt19937 rng(42);
    int mismatches = 0;
    for (int i = 0; i < 20000 && mismatches < 5; ++i) {
      const std::string s = random_text(rng);
      std::vector<tok::Segment> a, b;
      fast->find_matches(s, a);
      oracle->find_matches(s, b);
      auto show = [](const std::vector<tok::Segment>& v) {
        std::string o;
        for (const auto& x : v)
          o += "[" + std::to_string(x.start) + "," + std::to_string(x.end) + (x.is_match ? ")" : ")!");
        return o;
      };
      if (show(a) != show(b)) {
        ADD_FAILURE() << "pattern " << pattern << "\ntext: " << s << "\nfast:  " << show(a) << "\npcre2: " << show(b);
        ++mismatches;
      }
    }
  }
}

TEST(TokenizerUnicode, SplitBehaviours) {
  auto split = [](tok::SplitBehavior behavior, bool invert) {
    tok::SplitStep step(tok::make_literal_matcher("-"), behavior, invert);
    std::vector<std::string_view> out;
    step.split("a-b--c-", out);
    std::string joined;
    for (auto p : out) joined += "[" + std::string(p) + "]";
    return joined;
  };
  // Expected values from HF's pre_tokenizers.Split("-", behavior, invert).pre_tokenize_str("a-b--c-").
  EXPECT_EQ(split(tok::SplitBehavior::kRemoved, false), "[a][b][c]");
  EXPECT_EQ(split(tok::SplitBehavior::kIsolated, false), "[a][-][b][-][-][c][-]");
  EXPECT_EQ(split(tok::SplitBehavior::kMergedWithPrevious, false), "[a-][b-][-][c-]");
  EXPECT_EQ(split(tok::SplitBehavior::kMergedWithNext, false), "[a][-b][-][-c][-]");
  EXPECT_EQ(split(tok::SplitBehavior::kContiguous, false), "[a][-][b][--][c][-]");
  EXPECT_EQ(split(tok::SplitBehavior::kRemoved, true), "[-][-][-][-]");
  EXPECT_EQ(split(tok::SplitBehavior::kMergedWithPrevious, true), "[a][-b][-][-c][-]");
  EXPECT_EQ(split(tok::SplitBehavior::kMergedWithNext, true), "[a-][b-][-][c-]");
  EXPECT_EQ(split(tok::SplitBehavior::kContiguous, true), "[a][-][b][--][c][-]");
}

}  // namespace
}  // namespace moecel
