// Tokenizer against HuggingFace `tokenizers`: the ids, decodes and streaming decodes of every golden text
// (tests/golden/tokenizer, written by tools/reference/tokenizer_goldens.py) must match exactly, for the real OLMoE
// and Qwen3 tokenizer.json files and for small synthetic ones that use the options the real files do not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kGoldenDir = fs::path(MOECEL_SOURCE_DIR) / "tests" / "golden" / "tokenizer";
const fs::path kSharedTokenizers = fs::path(MOECEL_SHARED_DIR) / "data" / "tokenizers";

std::vector<json> read_jsonl(const fs::path& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::vector<json> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip, std::string* error) {
  StreamingDecoder dec(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = dec.feed(id);
    if (!unicode::is_valid_utf8(piece) && error->empty()) *error = "feed() returned invalid UTF-8";
    out += piece;
  }
  out += dec.flush();
  return out;
}

std::string preview(const std::string& s) {
  std::string p = s.substr(0, 60);
  for (char& c : p)
    if (c == '\n') c = ' ';
  return p;
}

// Checks every record of <name>.jsonl (over the corpus it names) and <name>_decode.jsonl. Tokenizers whose split
// regex goes through PCRE2 skip texts with characters PCRE2 10.42 classifies differently from HF (U+180E and
// anything newer than Unicode 14).
void check_goldens(const Tokenizer& tok, const std::string& name, bool uses_pcre2 = false) {
  std::vector<json> golden = read_jsonl(kGoldenDir / (name + ".jsonl"));
  ASSERT_FALSE(golden.empty());
  std::vector<json> corpus = read_jsonl(kGoldenDir / golden[0]["corpus"].get<std::string>());
  ASSERT_EQ(corpus.size() + 1, golden.size()) << name << ": golden and corpus differ in length";
  int failures = 0;
  size_t checked = 0;
  for (size_t i = 0; i < corpus.size() && failures < 10; ++i) {
    const json& rec = golden[i + 1];
    if (rec.contains("hf_error")) continue;  // HF itself fails on this text
    if (uses_pcre2 && rec.contains("beyond_pcre2")) continue;
    const std::string text = corpus[i]["text"];
    const std::string what = name + " " + corpus[i]["name"].get<std::string>() + " \"" + preview(text) + "\"";
    const std::vector<int32_t> want = rec["ids"];
    std::vector<int32_t> got = tok.encode(text);
    if (got != want) {
      size_t k = 0;
      while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
      ADD_FAILURE() << what << ": ids differ at index " << k << " (got " << got.size() << " ids, want " << want.size()
                    << ")";
      ++failures;
      continue;
    }
    std::vector<int32_t> want_special =
        rec.contains("ids_special") ? rec["ids_special"].get<std::vector<int32_t>>() : want;
    EXPECT_EQ(tok.encode(text, true), want_special) << what << ": add_special_tokens";
    const std::string decoded = rec.contains("decoded") ? rec["decoded"].get<std::string>() : text;
    const std::string decoded_skip = rec.contains("decoded_skip") ? rec["decoded_skip"].get<std::string>() : decoded;
    EXPECT_EQ(tok.decode(want), decoded) << what << ": decode";
    EXPECT_EQ(tok.decode(want, true), decoded_skip) << what << ": decode skipping special tokens";
    std::string error;
    EXPECT_EQ(stream_decode(tok, want, false, &error), decoded) << what << ": streaming decode";
    EXPECT_EQ(stream_decode(tok, want, true, &error), decoded_skip) << what << ": streaming decode, skip special";
    EXPECT_EQ(error, "") << what;
    ++checked;
  }
  EXPECT_EQ(failures, 0) << name << ": stopped after 10 mismatching texts";
  EXPECT_GT(checked, uses_pcre2 ? corpus.size() / 2 : corpus.size() * 9 / 10);

  for (const json& c : read_jsonl(kGoldenDir / (name + "_decode.jsonl"))) {
    const std::vector<int32_t> ids = c["ids"];
    std::string error;
    EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << name << " decode " << c["ids"].dump();
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>()) << name << " decode " << c["ids"].dump();
    EXPECT_EQ(stream_decode(tok, ids, false, &error), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(stream_decode(tok, ids, true, &error), c["decoded_skip"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(error, "");
  }
}

// The real tokenizers are loaded once per test binary (the Qwen3 file is 11 MB).
const Tokenizer* real_tokenizer(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(family);
  if (it != cache.end()) return it->second.get();
  fs::path path = kSharedTokenizers / family / "tokenizer.json";
  if (!fs::exists(path)) return nullptr;
  auto tok = std::make_unique<Tokenizer>(Tokenizer::load(path.string()));
  return (cache[family] = std::move(tok)).get();
}

#define REQUIRE_TOKENIZER(var, family)                                                   \
  const Tokenizer* var = real_tokenizer(family);                                         \
  if (!var)                                                                              \
  GTEST_SKIP() << "shared tokenizer " << (kSharedTokenizers / family / "tokenizer.json") \
               << " is missing (it lives in ../shared/data/tokenizers next to the repository)"

TEST(Tokenizer, OlmoeMatchesHuggingFace) {
  REQUIRE_TOKENIZER(tok, "olmoe");
  check_goldens(*tok, "olmoe");
}

TEST(Tokenizer, Qwen3MatchesHuggingFace) {
  REQUIRE_TOKENIZER(tok, "qwen3");
  check_goldens(*tok, "qwen3");
}

TEST(Tokenizer, SyntheticOptionsMatchHuggingFace) {
  // a: lstrip/rstrip/single_word/normalized added tokens under NFKC, prefix space, <s> $A </s>, "a b" merges.
  // b: Llama 3 regex, ignore_merges, fused <unk> for missing bytes, NFKD + Strip, Sequence post-processor.
  // c: split behaviours and PCRE2 patterns, byte fallback, Replace/Prepend, Roberta post-processor.
  for (const char* name : {"syn_a", "syn_b", "syn_c"}) {
    SCOPED_TRACE(name);
    Tokenizer tok = Tokenizer::load((kGoldenDir / (std::string(name) + ".json")).string());
    check_goldens(tok, name, /*uses_pcre2=*/std::string(name) == "syn_c");
  }
}

TEST(Tokenizer, VocabularyLookups) {
  REQUIRE_TOKENIZER(olmoe, "olmoe");
  REQUIRE_TOKENIZER(qwen, "qwen3");
  EXPECT_EQ(olmoe->vocab_size(), 50280);
  EXPECT_EQ(qwen->vocab_size(), 151669);
  EXPECT_EQ(olmoe->token_id("<|endoftext|>"), 50279);
  EXPECT_EQ(olmoe->token_id("<|padding|>"), 1);
  EXPECT_EQ(qwen->token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(qwen->token_id("<|im_end|>"), 151645);
  EXPECT_EQ(qwen->token_id("<think>"), 151667);
  EXPECT_EQ(qwen->find_token_id("Ġthe"), qwen->encode(" the").at(0));
  EXPECT_FALSE(qwen->find_token_id("<|no such token|>").has_value());
  EXPECT_THROW(qwen->token_id("<|no such token|>"), Error);
  EXPECT_TRUE(qwen->is_special(151645));
  EXPECT_FALSE(qwen->is_special(151667));  // <think> is an added token but not special
  EXPECT_FALSE(olmoe->is_special(50276));  // whitespace-run token
  EXPECT_TRUE(olmoe->is_special(50279));
  EXPECT_FALSE(olmoe->is_special(-1));
  EXPECT_FALSE(olmoe->is_special(1 << 30));
  EXPECT_EQ(olmoe->token(50276).value(), "  ");
  EXPECT_EQ(olmoe->token_bytes(50276), "  ");
  EXPECT_FALSE(olmoe->token(50280).has_value());
  EXPECT_EQ(qwen->token_bytes(qwen->token_id("Ġthe")), " the");
}

TEST(Tokenizer, StreamingDecoderHoldsSplitCharacters) {
  REQUIRE_TOKENIZER(tok, "olmoe");
  // Olmoe has no token for these emoji: they arrive as byte-level pieces that split the character.
  const std::string text = "a\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD b";  // a😀👍🏽 b
  std::vector<int32_t> ids = tok->encode(text);
  ASSERT_GT(ids.size(), 4u);
  StreamingDecoder dec(*tok);
  std::string out;
  bool held = false;
  for (int32_t id : ids) {
    std::string piece = dec.feed(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    if (dec.pending() > 0) held = true;
    out += piece;
  }
  EXPECT_TRUE(held) << "expected at least one character split across tokens";
  EXPECT_EQ(dec.pending(), 0u);
  EXPECT_EQ(out + dec.flush(), text);

  // A lone lead byte at the end becomes U+FFFD only at flush; a byte that cannot continue it comes out at once.
  const int32_t lead = tok->token_id("\xC3\xB0");  // "ð": the byte-level token of the single byte 0xF0
  ASSERT_EQ(tok->token_bytes(lead), "\xF0");
  StreamingDecoder d2(*tok);
  EXPECT_EQ(d2.feed(lead), "");
  EXPECT_EQ(d2.feed(tok->token_id("a")),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(d2.feed(lead), "");
  EXPECT_EQ(d2.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d2.flush(), "");
  // Special tokens can be skipped; unknown ids produce nothing.
  StreamingDecoder d3(*tok, /*skip_special_tokens=*/true);
  EXPECT_EQ(d3.feed(50279), "");
  EXPECT_EQ(d3.feed(999999), "");
  StreamingDecoder d4(*tok);
  EXPECT_EQ(d4.feed(50279), "<|endoftext|>");
}

TEST(Tokenizer, InvalidUtf8IsRepairedBeforeEncoding) {
  REQUIRE_TOKENIZER(tok, "qwen3");
  EXPECT_EQ(tok->encode("ab\xFF"
                        "cd\xE2\x82"),
            tok->encode("ab\xEF\xBF\xBD"
                        "cd\xEF\xBF\xBD"));
  EXPECT_EQ(tok->encode(std::string("a\0b", 3)),
            (std::vector<int32_t>{tok->token_id("a"), tok->token_id("Ā"), tok->token_id("b")}));
}

TEST(Tokenizer, RandomBytesRoundTrip) {
  // Arbitrary bytes (mostly invalid UTF-8): encoding never fails and decodes back to the repaired, NFC-normalized
  // text. '<' and '|' are left out so that no added token is spelled by chance.
  REQUIRE_TOKENIZER(olmoe, "olmoe");
  REQUIRE_TOKENIZER(qwen, "qwen3");
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(0, 80), byte(0, 255), ascii(0x20, 0x7E), coin(0, 3);
  for (int i = 0; i < 1500; ++i) {
    std::string s;
    for (int n = len(rng); n > 0; --n) {
      char c = char(coin(rng) == 0 ? byte(rng) : ascii(rng));
      if (c != '<' && c != '|') s.push_back(c);
    }
    const std::string want = unicode::normalize(unicode::to_valid_utf8(s), unicode::NormalForm::kNFC);
    for (const Tokenizer* tok : {olmoe, qwen}) {
      std::vector<int32_t> ids = tok->encode(s);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
      ASSERT_EQ(tok->decode(ids), want) << tok->origin();
    }
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  REQUIRE_TOKENIZER(tok, "qwen3");
  std::vector<json> corpus = read_jsonl(kGoldenDir / "corpus.jsonl");
  std::string text;
  for (const json& c : corpus)
    if (c["name"].get<std::string>().rfind("prose/", 0) == 0) text += c["text"].get<std::string>();
  text.resize(std::min<size_t>(text.size(), 120000));
  std::vector<int32_t> want = tok->encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = tok->encode(text); });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], want) << "thread " << t;
  EXPECT_EQ(tok->decode(want), text);
}

}  // namespace
}  // namespace moecel
