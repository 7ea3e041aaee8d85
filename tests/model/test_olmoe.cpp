// OLMoE end to end on tiny random checkpoints: decode with the KV cache equals a full forward at every
// position, every expert layout loads to the same model, and the CLI paths work.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli_runner.h"
#include "compare.h"
#include "decode_check.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/test_model.h"
#include "runtime/generate.h"

namespace moecel {
namespace {

using test::to_vector;

class OlmoeTiny : public ::testing::TestWithParam<int> {};

TEST_P(OlmoeTiny, DecodeWithCacheEqualsFullForward) {
  test::ScratchDir dir("olmoe-tiny");
  TestModelOptions opt;
  opt.bits = GetParam();
  opt.seed = 7;
  write_test_model(opt, dir.str());
  auto be = make_backend("cpu");
  auto model = load_model(dir.str(), *be);
  const std::vector<int32_t> ids = {5, 17, 300, 42, 42, 7, 511, 0, 128, 64, 3, 99};
  test::expect_decode_matches_full_forward(*model, *be, ids);
}

INSTANTIATE_TEST_SUITE_P(Bits, OlmoeTiny, ::testing::Values(4, 8, 0));

TEST(Olmoe, ExpertLayoutsGiveTheSameLogits) {
  // A dense checkpoint written with per-expert tensors, re-saved stacked and fused, must give identical logits.
  test::ScratchDir dir("olmoe-layouts");
  TestModelOptions opt;
  opt.bits = 0;
  opt.dtype = DType::kF32;
  write_test_model(opt, dir.str() + "/per_expert");
  WeightStore store = WeightStore::open_folder(dir.str() + "/per_expert");
  const int64_t n_layers = 2, n_experts = 8;
  for (const std::string layout : {"stacked", "fused"}) {
    std::vector<std::pair<std::string, Tensor>> out;
    std::vector<Tensor> keep;
    for (const auto& [name, t] : store.all()) {
      if (name.find(".mlp.experts.") == std::string::npos) out.emplace_back(name, t);
    }
    for (int64_t l = 0; l < n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      auto stacked = [&](const std::string& proj) {
        const Tensor& first = store.get(p + "experts.0." + proj + ".weight");
        Tensor s = make_host_tensor(DType::kF32, {n_experts, first.dim(0), first.dim(1)});
        for (int64_t e = 0; e < n_experts; ++e) {
          const Tensor& w = store.get(p + "experts." + std::to_string(e) + "." + proj + ".weight");
          std::memcpy(s.ptr<char>() + e * w.nbytes(), w.data, w.nbytes());
        }
        return s;
      };
      if (layout == "stacked") {
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
          out.emplace_back(p + "switch_mlp." + proj + ".weight", stacked(proj));
        }
      } else {
        Tensor g = stacked("gate_proj"), u = stacked("up_proj");
        const int64_t f = g.dim(1), h = g.dim(2);
        Tensor gu = make_host_tensor(DType::kF32, {n_experts, 2 * f, h});
        for (int64_t e = 0; e < n_experts; ++e) {
          std::memcpy(gu.ptr<float>() + e * 2 * f * h, g.ptr<float>() + e * f * h, size_t(f * h) * 4);
          std::memcpy(gu.ptr<float>() + (e * 2 + 1) * f * h, u.ptr<float>() + e * f * h, size_t(f * h) * 4);
        }
        out.emplace_back(p + "experts.gate_up_proj", gu);
        out.emplace_back(p + "experts.down_proj", stacked("down_proj"));
      }
    }
    std::filesystem::create_directories(dir.str() + "/" + layout);
    std::filesystem::copy_file(dir.str() + "/per_expert/config.json", dir.str() + "/" + layout + "/config.json");
    write_safetensors(dir.str() + "/" + layout + "/model.safetensors", out);
  }
  auto be = make_backend("cpu");
  std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
  std::vector<std::vector<float>> results;
  for (const char* layout : {"per_expert", "stacked", "fused"}) {
    auto model = load_model(dir.str() + "/" + layout, *be);
    KvCache cache = model->make_cache(int64_t(ids.size()));
    results.push_back(to_vector(*be, model->forward(ids, cache, true)));
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

TEST(Olmoe, GreedyGenerationIsDeterministicAndStopsAtMaxTokens) {
  test::ScratchDir dir("olmoe-gen");
  TestModelOptions opt;
  write_test_model(opt, dir.str());
  auto be = make_backend("cpu");
  auto model = load_model(dir.str(), *be);
  std::vector<int32_t> prompt = {10, 20, 30};
  GenerateOptions g;
  g.max_tokens = 12;
  g.stop_at_eos = false;
  GenerateResult a = generate(*model, prompt, g), b = generate(*model, prompt, g);
  EXPECT_EQ(a.output_ids.size(), 12u);
  EXPECT_EQ(a.output_ids, b.output_ids);
  EXPECT_EQ(a.stop_reason, "length");
  // Greedy generation must equal the argmax of teacher-forced logits over prompt + output.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), a.output_ids.begin(), a.output_ids.end() - 1);
  KvCache cache = model->make_cache(int64_t(all.size()));
  std::vector<int32_t> argmax = be->argmax(model->forward(all, cache, true));
  for (size_t i = 0; i < a.output_ids.size(); ++i) {
    EXPECT_EQ(argmax[prompt.size() - 1 + i], a.output_ids[i]) << "step " << i;
  }
}

}  // namespace
}  // namespace moecel
