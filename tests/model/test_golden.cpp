// Golden tests against the reference implementations: each tests/golden/<family>_*/ folder holds a checkpoint
// and golden.json + logits.npy written by transformers or mlx-lm (tools/reference/). `moecel logits` must match
// the teacher-forced logits within a relative L2 error of 1e-4 (f32 paths that differ only in summation order land near
// 1e-6) with the same argmax at every position, and greedy generation must reproduce the reference continuation.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "compare.h"
#include "io/npy.h"

namespace moecel {
namespace {

// Case folders are named <model_type>_<case> (tools/reference/make_*_golden.py).
constexpr const char* kFamilies[] = {"olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "dots1"};

std::vector<std::string> golden_cases() {
  std::vector<std::string> cases;
  const std::filesystem::path root = std::filesystem::path(MOECEL_SOURCE_DIR) / "tests" / "golden";
  if (!std::filesystem::exists(root)) return cases;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    const bool model_case = std::any_of(std::begin(kFamilies), std::end(kFamilies),
                                        [&](const char* f) { return name.starts_with(std::string(f) + "_"); });
    if (model_case && std::filesystem::exists(e.path() / "golden.json")) cases.push_back(name);
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

std::string dir_of(const std::string& c) {
  return std::string(MOECEL_SOURCE_DIR) + "/tests/golden/" + c;
}

nlohmann::json golden_of(const std::string& c) {
  return nlohmann::json::parse(test::read_text(dir_of(c) + "/golden.json"));
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, TeacherForcedLogits) {
  const std::string dir = dir_of(GetParam());
  const auto g = golden_of(GetParam());
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  test::ScratchDir out("golden");
  auto r = test::run_cli(
      fmt::format("logits --model {} --prompt-ids {} --out {}/l.npy", dir, fmt::join(prompt, ","), out.str()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  NpyArray got = read_npy(out.str() + "/l.npy");
  NpyArray want = read_npy(dir + "/" + g.value("logits_file", "logits.npy"));
  ASSERT_EQ(got.shape, want.shape);
  const int64_t n = want.shape[0], vocab = want.shape[1];
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = got.data.data() + t * vocab;
    const float* b = want.data.data() + t * vocab;
    const double rel = test::rel_l2(a, b, size_t(vocab));
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << "position " << t;
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b) << "argmax at position " << t;
  }
  RecordProperty("worst_rel_l2", fmt::format("{:.3g}", worst));
}

TEST_P(Golden, GreedyContinuation) {
  const std::string dir = dir_of(GetParam());
  const auto g = golden_of(GetParam());
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = g["greedy_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(want.empty());
  auto r = test::run_cli(fmt::format("generate --model {} --prompt-ids {} --max-tokens {} --ignore-eos --json", dir,
                                     fmt::join(prompt, ","), want.size()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"].get<std::vector<int32_t>>(), want);
}

INSTANTIATE_TEST_SUITE_P(Reference, Golden, ::testing::ValuesIn(golden_cases()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Golden);

TEST(GoldenCases, Present) {
  // The reference cases are committed; their absence would silently skip the comparisons above.
  EXPECT_GE(golden_cases().size(), 17u);  // 5 olmoe, 3 each of qwen2_moe, qwen3_moe, mixtral, dots1
}

}  // namespace
}  // namespace moecel
