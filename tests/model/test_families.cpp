// The MoE families beyond OLMoE (qwen2_moe, qwen3_moe, mixtral, dots1) on tiny random checkpoints: decode with the
// KV cache equals a full forward (past mixtral's sliding window too), ModelInfo counts only MoE layers, the fused
// decode path is dispatched once per MoE layer and decode step (MOECEL_TRACE=moe of the real binary), every expert
// layout loads to the same model, the real-size presets have the published parameter counts, and bad configs are
// errors. Logits against transformers are checked by test_golden.cpp on tests/golden/<family>_*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "../unit/expect_error.h"
#include "backend/backend.h"
#include "cli_runner.h"
#include "compare.h"
#include "decode_check.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel {
namespace {

using test::to_vector;

struct Family {
  std::string arch;
  int64_t n_layers, n_moe_layers;  // of the tiny preset
  std::string real_preset;
  double real_params;  // published total parameter count of the real model
};

const Family kFamilies[] = {
    {"qwen2_moe", 3, 2, "qwen1.5-moe-a2.7b", 14.3e9},  // tiny: layer 1 dense (mlp_only_layers)
    {"qwen3_moe", 2, 2, "qwen3-30b-a3b", 30.5e9},
    {"mixtral", 2, 2, "mixtral-8x7b", 46.7e9},
    {"dots1", 3, 2, "dots.llm1", 142e9},  // tiny: layer 0 dense (first_k_dense_replace)
};

void PrintTo(const Family& f, std::ostream* os) {
  *os << f.arch;
}

class FamilyTiny : public ::testing::TestWithParam<std::tuple<Family, int>> {};

TEST_P(FamilyTiny, DecodeWithCacheEqualsFullForward) {
  const auto& [fam, bits] = GetParam();
  test::ScratchDir dir(fam.arch + "-tiny");
  TestModelOptions opt;
  opt.arch = fam.arch;
  opt.bits = bits;
  opt.seed = 11;
  write_test_model(opt, dir.str());
  auto be = make_backend("cpu");
  auto model = load_model(dir.str(), *be);
  const ModelInfo& info = model->info();
  EXPECT_EQ(info.model_type, fam.arch);
  EXPECT_EQ(info.n_layers, fam.n_layers);
  EXPECT_EQ(info.n_moe_layers, fam.n_moe_layers);
  EXPECT_GT(info.active_bytes_per_token, 0u);
  EXPECT_LT(info.active_bytes_per_token, info.weight_bytes);
  EXPECT_EQ(info.eos_token_ids, std::vector<int32_t>{511});
  // 24 tokens: past the tiny mixtral's sliding window of 16.
  const std::vector<int32_t> ids = {5, 17, 300, 42, 42,  7,   511, 0, 128, 64, 3, 99,
                                    1, 2,  3,   4,  200, 201, 5,   6, 7,   8,  9, 10};
  test::expect_decode_matches_full_forward(*model, *be, ids);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTiny,
                         ::testing::Combine(::testing::ValuesIn(kFamilies), ::testing::Values(4, 8, 0)),
                         [](const auto& i) {
                           return std::get<0>(i.param).arch + "_bits" + std::to_string(std::get<1>(i.param));
                         });

// The dispatch trace of the real binary: with the fused path on (the default), every MoE layer of every decode step
// takes it, and dense layers are not MoE dispatches at all.
class FamilyTrace : public ::testing::TestWithParam<std::tuple<Family, int>> {};

TEST_P(FamilyTrace, FusedDispatchesAreDecodeStepsTimesMoeLayers) {
  const auto& [fam, bits] = GetParam();
  test::ScratchDir dir(fam.arch + "-trace");
  const test::CliResult made = test::run_cli("make-test-model --arch " + fam.arch + " --preset tiny --bits " +
                                             std::to_string(bits) + " --out '" + dir.str() + "/m'");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string cmd = "env MOECEL_TRACE=moe '" + std::string(MOECEL_BINARY) + "' generate --model '" + dir.str() +
                          "/m' --prompt-ids 1,2,3 --max-tokens 9 --ignore-eos >/dev/null 2>'" + dir.str() + "/e'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::read_text(dir.str() + "/e");
  const std::string err = test::read_text(dir.str() + "/e");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("moe dispatch: decode_steps=(\\d+) fused=(\\d+) gather=(\\d+)")))
      << err;
  EXPECT_EQ(std::stoll(m[1]), 8) << err;  // 9 tokens: the first comes from the prefill
  EXPECT_EQ(std::stoll(m[2]), 8 * fam.n_moe_layers) << err;
  EXPECT_EQ(std::stoll(m[3]), 0) << err;
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTrace,
                         ::testing::Combine(::testing::ValuesIn(kFamilies), ::testing::Values(4, 8)),
                         [](const auto& i) {
                           return std::get<0>(i.param).arch + "_bits" + std::to_string(std::get<1>(i.param));
                         });

TEST(Families, RegisteredWithTinyAndRealPresets) {
  const std::vector<std::string> names = architecture_names();
  for (const Family& f : kFamilies) {
    ASSERT_NE(std::find(names.begin(), names.end(), f.arch), names.end()) << f.arch;
    const Architecture& a = find_architecture(f.arch);
    EXPECT_EQ(a.presets, (std::vector<std::string>{"tiny", f.real_preset})) << f.arch;
    expect_error([&] { a.test_model("huge", nlohmann::json::object()); }, f.real_preset);
  }
}

TEST(Families, RealPresetsHaveThePublishedParameterCounts) {
  for (const Family& f : kFamilies) {
    const TestModelSpec s = find_architecture(f.arch).test_model(f.real_preset, nlohmann::json::object());
    EXPECT_EQ(s.config["model_type"], f.arch);
    double params = 0;
    for (const TestTensor& t : s.tensors) params += double(shape_numel(t.shape));
    EXPECT_NEAR(params / f.real_params, 1.0, 0.02) << f.arch << ": " << params;
  }
}

// A dense per-expert checkpoint re-saved with transformers 5's fused experts (mlp.experts.gate_up_proj, gate rows
// first; mixtral's block moves from block_sparse_moe to mlp) must give identical logits.
TEST(Families, FusedExpertLayoutGivesTheSameLogits) {
  for (const std::string arch : {"qwen2_moe", "mixtral"}) {
    test::ScratchDir dir(arch + "-layouts");
    TestModelOptions opt;
    opt.arch = arch;
    opt.bits = 0;
    opt.dtype = DType::kF32;
    write_test_model(opt, dir.str() + "/per_expert");
    WeightStore store = WeightStore::open_folder(dir.str() + "/per_expert");
    std::vector<std::pair<std::string, Tensor>> out;
    std::map<std::string, std::map<std::string, std::vector<const Tensor*>>> experts;  // block -> proj -> per expert
    const std::regex re(R"((model\.layers\.\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight)");
    for (const auto& [name, t] : store.all()) {
      std::smatch m;
      if (std::regex_match(name, m, re)) {
        auto& v = experts[m[1].str() + ".mlp"][m[4].str()];
        v.resize(std::max(v.size(), size_t(std::stoi(m[3].str()) + 1)));
        v[size_t(std::stoi(m[3].str()))] = &t;
      } else {
        std::string n = name;
        if (const size_t p = n.find(".block_sparse_moe."); p != std::string::npos) n.replace(p, 18, ".mlp.");
        out.emplace_back(n, t);
      }
    }
    ASSERT_FALSE(experts.empty());
    for (const auto& [block, projs] : experts) {
      const std::vector<const Tensor*>&g = projs.at("gate_proj"), &u = projs.at("up_proj"), &d = projs.at("down_proj");
      const int64_t e = int64_t(g.size()), f = g[0]->dim(0), h = g[0]->dim(1);
      Tensor gu = make_host_tensor(DType::kF32, {e, 2 * f, h}), dn = make_host_tensor(DType::kF32, {e, h, f});
      for (int64_t i = 0; i < e; ++i) {
        std::memcpy(gu.ptr<float>() + i * 2 * f * h, g[size_t(i)]->data, size_t(f * h) * 4);
        std::memcpy(gu.ptr<float>() + (i * 2 + 1) * f * h, u[size_t(i)]->data, size_t(f * h) * 4);
        std::memcpy(dn.ptr<float>() + i * h * f, d[size_t(i)]->data, size_t(f * h) * 4);
      }
      out.emplace_back(block + ".experts.gate_up_proj", gu);
      out.emplace_back(block + ".experts.down_proj", dn);
    }
    std::filesystem::create_directories(dir.str() + "/fused");
    std::filesystem::copy_file(dir.str() + "/per_expert/config.json", dir.str() + "/fused/config.json");
    write_safetensors(dir.str() + "/fused/model.safetensors", out);
    auto be = make_backend("cpu");
    std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6};
    std::vector<std::vector<float>> results;
    for (const char* layout : {"per_expert", "fused"}) {
      auto model = load_model(dir.str() + "/" + layout, *be);
      KvCache cache = model->make_cache(int64_t(ids.size()));
      results.push_back(to_vector(*be, model->forward(ids, cache, true)));
    }
    EXPECT_EQ(results[0], results[1]) << arch;
  }
}

void expect_config_error(const std::string& arch, const nlohmann::json& overrides, const std::string& what) {
  expect_error([&] { find_architecture(arch).test_model("tiny", overrides); }, what);
}

TEST(Families, BadConfigsAreErrors) {
  expect_config_error("dots1", {{"n_group", 3}}, "n_routed_experts 16 is not a multiple of n_group 3");
  expect_config_error("qwen2_moe", {{"layer_types", {"sliding_attention", "full_attention", "full_attention"}}},
                      "layer 0 uses sliding attention but sliding_window is not set");
  expect_config_error("dots1", {{"layer_types", {"full_attention", "chunked_attention", "full_attention"}}},
                      "chunked_attention");
  expect_config_error("mixtral", {{"head_dim", 33}}, "head dimension 33 must be even");
  expect_config_error("qwen3_moe", {{"hidden_act", "gelu"}}, "hidden_act 'gelu' is not supported");
  expect_config_error("mixtral", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}, "rope type 'yarn'");
  expect_config_error("qwen2_moe", {{"mlp_only_layers", {7}}}, "mlp_only_layers");
  expect_config_error("qwen3_moe", {{"num_key_value_heads", 3}}, "not a multiple of num_key_value_heads 3");
}

TEST(Families, TransformersExpertCountAliasesAreRead) {
  // transformers 5 writes qwen3_moe's num_experts as num_local_experts and reads dots1's num_local_experts as
  // n_routed_experts.
  test::ScratchDir dir("qwen3-alias");
  TestModelOptions opt;
  opt.arch = "qwen3_moe";
  opt.config_overrides = {{"num_experts", nullptr}, {"num_local_experts", 8}};
  write_test_model(opt, dir.str());
  auto be = make_backend("cpu");
  EXPECT_EQ(load_model(dir.str(), *be)->info().n_moe_layers, 2);
}

}  // namespace
}  // namespace moecel
