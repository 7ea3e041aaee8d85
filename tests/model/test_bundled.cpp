// The bundled trained model (models/default) against its transformers goldens (tests/golden/bundled/):
// identical greedy ids and byte-identical text for every prompt, teacher-forced logits within a relative L2 of
// 1e-4 with the same argmax, and the prompt text tokenized to the same ids as HF tokenizers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli_runner.h"
#include "compare.h"
#include "io/npy.h"
#include "models/registry.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace moecel {
namespace {

const std::string kModel = std::string(MOECEL_SOURCE_DIR) + "/models/default";
const std::string kGolden = std::string(MOECEL_SOURCE_DIR) + "/tests/golden/bundled";

class Bundled : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = nlohmann::json::parse(test::read_text(kGolden + "/golden.json"));
    backend_ = make_backend("cpu").release();
    model_ = load_model(kModel, *backend_).release();
    tokenizer_ = new Tokenizer(Tokenizer::load(kModel + "/tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    delete backend_;
  }
  static nlohmann::json golden_;
  static Backend* backend_;
  static Model* model_;
  static Tokenizer* tokenizer_;
};
nlohmann::json Bundled::golden_;
Backend* Bundled::backend_ = nullptr;
Model* Bundled::model_ = nullptr;
Tokenizer* Bundled::tokenizer_ = nullptr;

TEST_F(Bundled, GreedyIdsAndTextMatchTransformers) {
  ASSERT_GE(golden_["cases"].size(), 8u);
  for (const auto& c : golden_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer_->encode(c["prompt_text"].get<std::string>(), false), prompt);
    GenerateOptions opt;
    opt.max_tokens = int(want.size());
    opt.stop_at_eos = false;
    GenerateResult r = generate(*model_, prompt, opt);
    EXPECT_EQ(r.output_ids, want);
    EXPECT_EQ(tokenizer_->decode(r.output_ids, false), c["greedy_text"].get<std::string>());
  }
}

TEST_F(Bundled, TeacherForcedLogits) {
  for (const auto& c : golden_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto ids = c["logits_ids"].get<std::vector<int32_t>>();
    NpyArray want = read_npy(kGolden + "/" + c["logits_file"].get<std::string>());
    KvCache cache = model_->make_cache(int64_t(ids.size()));
    Tensor logits = model_->forward(ids, cache, true);
    ASSERT_EQ(logits.shape, want.shape);
    std::vector<float> got(static_cast<size_t>(logits.numel()));
    backend_->to_host(logits, got.data());
    const int64_t vocab = want.shape[1];
    for (int64_t t = 0; t < want.shape[0]; ++t) {
      const float* a = got.data() + t * vocab;
      const float* b = want.data.data() + t * vocab;
      EXPECT_LT(test::rel_l2(a, b, size_t(vocab)), 1e-4) << "position " << t;
      EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b) << "position " << t;
    }
  }
}

TEST_F(Bundled, DemoCommandUsesTheBundledModel) {
  // No --model: the CLI falls back to models/default and streams text.
  auto r = test::run_cli("generate --prompt 'And the LORD spake unto Moses, saying,' --max-tokens 12");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("And the LORD spake unto Moses, saying,", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("And the LORD spake unto Moses, saying,").size() + 10);
}

}  // namespace
}  // namespace moecel
