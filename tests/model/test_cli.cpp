// The CLI end to end: subcommands on a tiny checkpoint, and bad input that must exit 1 with one clear
// message (never a crash or an abort signal).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "models/test_model.h"

namespace moecel {
namespace {

using test::run_cli;
using test::ScratchDir;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("cli-model");
    TestModelOptions opt;
    opt.seed = 3;
    write_test_model(opt, dir_->str() + "/m");
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return dir_->str() + "/m"; }
  // A copy of the model folder whose config.json is edited by `edit`.
  static std::string with_config(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
    const std::string d = dir_->str() + "/" + tag;
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(model() + "/model.safetensors", d + "/model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    nlohmann::json j = nlohmann::json::parse(test::read_text(model() + "/config.json"));
    edit(j);
    std::ofstream(d + "/config.json") << j.dump();
    return d;
  }
  static void expect_error(const test::CliResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr was: " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
  static ScratchDir* dir_;
};
ScratchDir* CliTest::dir_ = nullptr;

TEST_F(CliTest, GenerateJson) {
  auto r = run_cli("generate --model " + model() + " --prompt-ids 1,2,3 --max-tokens 5 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(j["output_ids"].size(), 5u);
  EXPECT_TRUE(j.contains("decode_tokens_per_second"));
  EXPECT_TRUE(j.contains("prefill_tokens_per_second"));
}

TEST_F(CliTest, SamplingIsSeeded) {
  const std::string args = "generate --model " + model() +
                           " --prompt-ids 4,5 -n 8 --ignore-eos --json "
                           "--temperature 1.5 --top-k 50 --top-p 0.95 --min-p 0.01 ";
  auto a = run_cli(args + "--seed 1"), b = run_cli(args + "--seed 1");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["output_ids"], nlohmann::json::parse(b.out)["output_ids"]);
}

TEST_F(CliTest, LogitsWritesNpy) {
  ScratchDir out("logits");
  auto r = run_cli("logits --model " + model() + " --prompt-ids 1,2,3,4 --out " + out.str() + "/l.npy");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  NpyArray a = read_npy(out.str() + "/l.npy");
  EXPECT_EQ(a.shape, Shape({4, 512}));
}

TEST_F(CliTest, InspectReportsActiveBytes) {
  auto r = run_cli("inspect --model " + model() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "olmoe");
  EXPECT_GT(j["active_bytes_per_token"].get<int64_t>(), 0);
  EXPECT_LT(j["active_bytes_per_token"].get<int64_t>(), j["weight_bytes"].get<int64_t>());
}

TEST_F(CliTest, PromptIdOutsideVocab) {
  expect_error(run_cli("generate --model " + model() + " --prompt-ids 1,512"), "outside the vocabulary");
}

TEST_F(CliTest, MalformedPromptIds) {
  expect_error(run_cli("generate --model " + model() + " --prompt-ids 1,x,3"), "--prompt-ids");
}

TEST_F(CliTest, UnknownModelType) {
  auto d = with_config("unknown-type", [](nlohmann::json& j) { j["model_type"] = "llama9"; });
  expect_error(run_cli("generate --model " + d + " --prompt-ids 1"), "unknown model_type 'llama9'");
}

TEST_F(CliTest, TopKLargerThanExperts) {
  auto d = with_config("topk", [](nlohmann::json& j) { j["num_experts_per_tok"] = 9; });
  expect_error(run_cli("generate --model " + d + " --prompt-ids 1"), "num_experts_per_tok");
}

TEST_F(CliTest, ConfigShapeDisagreesWithTensors) {
  auto d = with_config("hidden", [](nlohmann::json& j) { j["intermediate_size"] = 256; });
  expect_error(run_cli("generate --model " + d + " --prompt-ids 1"), "expected");
}

TEST_F(CliTest, BitsDisagreeWithConfig) {
  auto d = with_config("bits", [](nlohmann::json& j) {
    j["quantization"]["bits"] = 8;
    j.erase("quantization_config");
  });
  expect_error(run_cli("generate --model " + d + " --prompt-ids 1"), "bits");
}

TEST_F(CliTest, TruncatedSafetensors) {
  auto d = with_config("truncated", [](nlohmann::json&) {});
  std::filesystem::resize_file(d + "/model.safetensors", std::filesystem::file_size(d + "/model.safetensors") / 2);
  expect_error(run_cli("generate --model " + d + " --prompt-ids 1"), "model.safetensors");
}

TEST_F(CliTest, MissingTensor) {
  auto d = with_config("missing", [](nlohmann::json&) {});
  WeightStore store = WeightStore::open_folder(model());
  std::vector<std::pair<std::string, Tensor>> keep;
  for (const auto& [name, t] : store.all()) {
    if (name != "model.layers.1.self_attn.k_norm.weight") keep.emplace_back(name, t);
  }
  write_safetensors(d + "/model.safetensors", keep);
  expect_error(run_cli("generate --model " + d + " --prompt-ids 1"), "model.layers.1.self_attn.k_norm.weight");
}

TEST_F(CliTest, MissingFolderAndBadOptions) {
  expect_error(run_cli("generate --model /nonexistent/folder --prompt-ids 1"), "/nonexistent/folder");
  expect_error(run_cli("generate --model " + model() + " --prompt-ids 1 --temperature -1"), "--temperature");
  expect_error(run_cli("generate --model " + model() + " --prompt-ids 1 --backend tpu"), "unknown backend 'tpu'");
  auto r = run_cli("generate --model " + model() + " --prompt-ids 1 --max-tokens many");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--max-tokens"), std::string::npos) << r.err;
}

TEST_F(CliTest, UnknownCpuSimdLevel) {
  // A misspelt level must not quietly run another kernel set than the one a benchmark asked for.
  ::setenv("MOECEL_CPU_SIMD", "avx3", 1);
  const test::CliResult bad = run_cli("generate --model " + model() + " --prompt-ids 1,2 --max-tokens 2");
  ::setenv("MOECEL_CPU_SIMD", "AVX2", 1);
  const test::CliResult good = run_cli("generate --model " + model() + " --prompt-ids 1,2 --max-tokens 2");
  ::unsetenv("MOECEL_CPU_SIMD");
  expect_error(bad, "MOECEL_CPU_SIMD='avx3'");
  EXPECT_EQ(good.exit_code, 0) << good.err;
}

}  // namespace
}  // namespace moecel
