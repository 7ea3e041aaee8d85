// Tokenizer loading errors: malformed or unsupported tokenizer.json content must throw moecel::Error naming the
// file and the offending field, never crash. Also checks a minimal hand-made tokenizer end to end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace moecel {
namespace {

using json = nlohmann::json;

// A complete byte-level tokenizer: the 256 byte characters plus "ab" from one merge.
json minimal() {
  json vocab = json::object();
  int id = 0, extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t c = printable ? char32_t(b) : char32_t(256 + extra++);
    std::string s;
    if (c < 0x80)
      s.push_back(char(c));
    else {
      s.push_back(char(0xC0 | (c >> 6)));
      s.push_back(char(0x80 | (c & 0x3F)));
    }
    vocab[s] = id++;
  }
  vocab["ab"] = id++;
  vocab["<eos>"] = id++;
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", id - 1}, {"content", "<eos>"}, {"special", true}, {"normalized", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

// Expects from_json to throw an Error whose message contains every fragment.
void expect_error(const json& j, std::initializer_list<std::string> fragments) {
  try {
    Tokenizer::from_json(j.dump(), "my/tokenizer.json");
    ADD_FAILURE() << "no error for " << j.dump().substr(0, 200);
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("my/tokenizer.json"), std::string::npos) << msg;
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

TEST(TokenizerErrors, MinimalTokenizerWorks) {
  Tokenizer tok = Tokenizer::from_json(minimal().dump(), "minimal");
  EXPECT_EQ(tok.vocab_size(), 258);
  std::vector<int32_t> ids = tok.encode("ab a<eos>");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0], 256);
  EXPECT_EQ(ids[3], 257);
  EXPECT_EQ(tok.decode(ids), "ab a<eos>");
  EXPECT_EQ(tok.decode(ids, true), "ab a");
}

TEST(TokenizerErrors, MissingFileAndBadJson) {
  try {
    Tokenizer::load("/nonexistent/dir/tokenizer.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/tokenizer.json"), std::string::npos);
  }
  try {
    Tokenizer::load("/tmp");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_json("{\"model\": ", "x"), Error);
  EXPECT_THROW(Tokenizer::from_json("[1, 2]", "x"), Error);
  EXPECT_THROW(Tokenizer::from_json("", "x"), Error);
}

TEST(TokenizerErrors, ModelProblemsNameTheField) {
  json j = minimal();
  j.erase("model");
  expect_error(j, {"model", "missing"});

  j = minimal();
  j["model"]["type"] = "WordPiece";
  expect_error(j, {"model.type", "WordPiece"});

  j = minimal();
  j["model"]["merges"] = json::array({"a b", "a zz"});
  expect_error(j, {"model.merges[1]", "zz"});

  j = minimal();
  j["model"]["merges"] = json::array({"a b c"});
  expect_error(j, {"model.merges[0]"});

  j = minimal();
  j["model"]["merges"] = json::array({json::array({"b", "a"})});  // "ba" is not in the vocabulary
  expect_error(j, {"model.merges[0]", "ba"});

  j = minimal();
  j["model"]["merges"] = json::array({42});
  expect_error(j, {"model.merges[0]"});

  j = minimal();
  j["model"]["vocab"]["x"] = -3;
  expect_error(j, {"model.vocab[\"x\"]"});

  j = minimal();
  j["model"]["vocab"]["x"] = "seven";
  expect_error(j, {"model.vocab[\"x\"]"});

  j = minimal();
  j["model"]["vocab"] = json::array();
  expect_error(j, {"model.vocab"});

  j = minimal();
  j["model"]["dropout"] = 0.1;
  expect_error(j, {"model.dropout"});

  j = minimal();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_error(j, {"model.continuing_subword_prefix"});
}

TEST(TokenizerErrors, PipelineProblemsNameTheField) {
  json j = minimal();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_error(j, {"normalizer.type", "Lowercase"});

  j = minimal();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "BertNormalizer"}}})}};
  expect_error(j, {"normalizer.normalizers[1].type", "BertNormalizer"});

  j = minimal();
  j["pre_tokenizer"] = nullptr;
  expect_error(j, {"pre_tokenizer", "ByteLevel"});

  j = minimal();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j, {"pre_tokenizer.type", "Whitespace"});

  j = minimal();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "ByteLevel"}}, {{"type", "ByteLevel"}}})}};
  expect_error(j, {"pre_tokenizer.pretokenizers[1]"});

  j = minimal();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}}})}};
  expect_error(j, {"(unclosed"});

  j = minimal();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}},
                                     {{"type", "ByteLevel"}}})}};
  expect_error(j, {"pre_tokenizer.pretokenizers[0].behavior", "Sideways"});

  j = minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, {"decoder.type", "WordPiece"});

  j = minimal();
  j.erase("decoder");
  expect_error(j, {"decoder"});

  j = minimal();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}})},
                         {"special_tokens", json::object()}};
  expect_error(j, {"post_processor.special_tokens", "<bos>"});

  j = minimal();
  j["post_processor"] = {{"type", "Mystery"}};
  expect_error(j, {"post_processor.type", "Mystery"});

  j = minimal();
  j["added_tokens"] = json::array({{{"id", 5}}});
  expect_error(j, {"added_tokens[0].content", "missing"});

  j = minimal();
  j["added_tokens"] = json::array({{{"id", "five"}, {"content", "x"}}});
  expect_error(j, {"added_tokens[0].id"});
}

TEST(TokenizerErrors, TemplatePostProcessorAddsBosAndEos) {
  json j = minimal();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<eos>", {{"id", "<eos>"}, {"ids", json::array({257})}, {"tokens", json::array({"<eos>"})}}}}}};
  Tokenizer tok = Tokenizer::from_json(j.dump(), "t");
  EXPECT_EQ(tok.encode("ab", true), (std::vector<int32_t>{257, 256, 257}));
  EXPECT_EQ(tok.encode("ab", false), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok.encode("", true), (std::vector<int32_t>{257, 257}));
}

}  // namespace
}  // namespace moecel
