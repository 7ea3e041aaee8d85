// `moecel tokenize` / `moecel detokenize` end to end through the built binary, with the shared OLMoE and Qwen3
// tokenizers (ids from HuggingFace tokenizers 0.23.3).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#ifdef MOECEL_BINARY
#include "../model/cli_runner.h"

namespace moecel {
namespace {

namespace fs = std::filesystem;

std::string shared_tokenizer(const std::string& family) {
  return (fs::path(MOECEL_SHARED_DIR) / "data" / "tokenizers" / family / "tokenizer.json").string();
}

#define REQUIRE_FILE(path) \
  if (!fs::exists(path)) GTEST_SKIP() << (path) << " is missing (shared tokenizers live in ../shared next to the repo)"

TEST(TokenizerCli, TokenizePrintsJsonIds) {
  const std::string olmoe = shared_tokenizer("olmoe"), qwen = shared_tokenizer("qwen3");
  REQUIRE_FILE(olmoe);
  REQUIRE_FILE(qwen);
  auto r = test::run_cli("tokenize --tokenizer '" + olmoe + "' --text 'Hello world'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[12092, 1533]\n");
  r = test::run_cli("tokenize --tokenizer '" + qwen + "' --text '<|im_start|>user'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[151644, 872]\n");
  r = test::run_cli("tokenize --tokenizer '" + qwen + "' --text ''");
  EXPECT_EQ(r.out, "[]\n");
}

TEST(TokenizerCli, DetokenizePrintsText) {
  const std::string olmoe = shared_tokenizer("olmoe");
  REQUIRE_FILE(olmoe);
  auto r = test::run_cli("detokenize --tokenizer '" + olmoe + "' --ids 12092,1533,50279");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello world<|endoftext|>\n");
  r = test::run_cli("detokenize --tokenizer '" + olmoe + "' --ids 12092,1533,50279 --skip-special");
  EXPECT_EQ(r.out, "Hello world\n");
}

TEST(TokenizerCli, ErrorsExitWithOne) {
  const std::string olmoe = shared_tokenizer("olmoe");
  REQUIRE_FILE(olmoe);
  auto r = test::run_cli("detokenize --tokenizer '" + olmoe + "' --ids 1,two");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--ids"), std::string::npos) << r.err;
  r = test::run_cli("tokenize --tokenizer /nonexistent/tokenizer.json --text x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/tokenizer.json"), std::string::npos) << r.err;
  r = test::run_cli("tokenize --tokenizer '" + olmoe + "'");  // --text is required
  EXPECT_NE(r.exit_code, 0);
}

}  // namespace
}  // namespace moecel
#endif  // MOECEL_BINARY
