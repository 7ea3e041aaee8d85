// The fused single-token decode-MoE path on the CPU: against an all-f32 reference built from MLX's dequantization
// (normalized RMS <= 5e-4, DESIGN.md section 5), against the gather path, determinism, the gating rules, and the
// dispatch trace of the real binary (MOECEL_TRACE=moe) on tiny checkpoints, including every fallback case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cli_runner.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "models/moe_dispatch.h"
#include "models/registry.h"
#include "models/switch_glu.h"
#include "moe_reference.h"
#include "quant/affine.h"

namespace moecel {
namespace {

using test::Rng;

constexpr double kFusedVsF32 = 5e-4;  // normalized RMS, DESIGN.md section 5

using Case = test::MoeCase;
using Problem = test::MoeProblem;

Tensor host_copy(DType dt, Shape shape, const void* src) {
  Tensor t = make_host_tensor(dt, std::move(shape));
  std::memcpy(t.data, src, size_t(t.nbytes()));
  return t;
}

std::vector<float> run_path(Backend& be, const Problem& p, Activation act, bool fused) {
  const int64_t hidden = p.w.gate.in, k = int64_t(p.idx.size());
  const Tensor x = host_copy(DType::kF32, {1, hidden}, p.x.data());
  const Tensor idx = host_copy(DType::kI32, {1, k}, p.idx.data());
  const Tensor wts = host_copy(DType::kF32, {1, k}, p.route_w.data());
  const SwitchGLU glu(p.w, act);
  const Tensor out = fused ? glu.forward_fused(be, x, idx, wts) : glu.forward_gather(be, x, idx, wts);
  return std::vector<float>(out.ptr<float>(), out.ptr<float>() + hidden);
}

class FusedMoeCpu : public ::testing::TestWithParam<Case> {};

TEST_P(FusedMoeCpu, MatchesF32ReferenceAndGatherPath) {
  const Case c = GetParam();
  const Problem p = test::make_moe_problem(c, 7 + c.gate_bits * 10 + c.down_bits + c.group_size);
  CpuBackend be;
  const std::vector<float> fused = run_path(be, p, c.act, true);
  const std::vector<float> ref = test::moe_reference(p, c.act);
  for (float v : fused) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LE(test::normalized_rms(fused, ref), kFusedVsF32);
  // The CPU fused path runs the gather path's row kernels and weighted sum in the same order: identical bits.
  const std::vector<float> gather = run_path(be, p, c.act, false);
  EXPECT_EQ(fused, gather);
}

TEST_P(FusedMoeCpu, BitwiseDeterministicAcrossRerunsAndThreadCounts) {
  const Case c = GetParam();
  const Problem p = test::make_moe_problem(c, 99);
  CpuBackend be;
  const int saved = num_threads();
  set_num_threads(1);
  const std::vector<float> one = run_path(be, p, c.act, true);
  set_num_threads(2);
  const std::vector<float> two = run_path(be, p, c.act, true);
  const std::vector<float> again = run_path(be, p, c.act, true);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_EQ(two, again);
}

INSTANTIATE_TEST_SUITE_P(Formats, FusedMoeCpu,
                         ::testing::Values(Case{4, 4, 64, 8, 256, 128, 4, Activation::kSiLU, DType::kBF16},
                                           Case{8, 8, 64, 8, 256, 128, 4, Activation::kSiLU, DType::kF16},
                                           Case{4, 6, 64, 8, 256, 128, 4, Activation::kSiLU, DType::kBF16},
                                           Case{4, 8, 32, 6, 96, 160, 3, Activation::kGeLU, DType::kF32},
                                           Case{8, 4, 128, 4, 384, 256, 2, Activation::kReLU2, DType::kBF16},
                                           Case{4, 4, 64, 16, 2048, 1024, 8, Activation::kSiLU,
                                                DType::kF16},  // OLMoE-1B-7B expert
                                           Case{4, 4, 64, 4, 128, 64, 1, Activation::kSiLU, DType::kBF16}));

// ---- gating (DESIGN.md section 5): anything else silently takes the gather path ----

struct GateFixture : ::testing::Test {
  CpuBackend be;
  FusedMoeSettings saved = fused_moe_settings();
  void TearDown() override { set_fused_moe_settings(saved); }
  SwitchGLU glu(int gbits, int ubits, int dbits, int gg = 64, int ug = 64, int dg = 64, int64_t ffn = 128) {
    Rng rng(3);
    SwitchWeights w;
    w.gate = test::random_quant("g", 4, ffn, 128, gbits, gg, DType::kBF16, rng);
    w.up = test::random_quant("u", 4, ffn, 128, ubits, ug, DType::kBF16, rng);
    w.down = test::random_quant("d", 4, 128, ffn, dbits, dg, DType::kBF16, rng);
    return SwitchGLU(w, Activation::kSiLU);
  }
};

TEST_F(GateFixture, QualifyingFormats) {
  set_fused_moe_settings({true, -1});
  EXPECT_TRUE(glu(4, 4, 4).fused_eligible(be));
  EXPECT_TRUE(glu(8, 8, 8).fused_eligible(be));
  EXPECT_TRUE(glu(4, 4, 6).fused_eligible(be));
  EXPECT_TRUE(glu(8, 8, 4).fused_eligible(be));
}

TEST_F(GateFixture, UnsupportedFormatsFallBack) {
  set_fused_moe_settings({true, -1});
  EXPECT_FALSE(glu(3, 3, 4).fused_eligible(be));  // gate/up bits not in {4, 8}
  EXPECT_FALSE(glu(5, 5, 4).fused_eligible(be));
  EXPECT_FALSE(glu(6, 6, 4).fused_eligible(be));
  EXPECT_FALSE(glu(4, 8, 4).fused_eligible(be));  // gate and up differ
  EXPECT_FALSE(glu(4, 4, 5).fused_eligible(be));  // down bits not in {4, 6, 8}
  EXPECT_FALSE(glu(4, 4, 3).fused_eligible(be));
  EXPECT_FALSE(glu(4, 4, 4, 64, 64, 32).fused_eligible(be));  // group sizes differ
  EXPECT_FALSE(glu(4, 4, 4, 32, 64, 64).fused_eligible(be));
}

TEST_F(GateFixture, DenseExpertsFallBack) {
  set_fused_moe_settings({true, -1});
  Rng rng(5);
  SwitchWeights w;
  w.gate = LinearWeight::dense_from("g", test::random_tensor(DType::kBF16, {4, 64, 128}, rng), true);
  w.up = LinearWeight::dense_from("u", test::random_tensor(DType::kBF16, {4, 64, 128}, rng), true);
  w.down = LinearWeight::dense_from("d", test::random_tensor(DType::kBF16, {4, 128, 64}, rng), true);
  EXPECT_FALSE(SwitchGLU(w, Activation::kSiLU).fused_eligible(be));
}

TEST_F(GateFixture, FlagAndDffCap) {
  const SwitchGLU g = glu(4, 4, 4, 64, 64, 64, 256);
  set_fused_moe_settings({false, -1});
  EXPECT_FALSE(g.fused_eligible(be));
  set_fused_moe_settings({true, 255});
  EXPECT_FALSE(g.fused_eligible(be));
  set_fused_moe_settings({true, 256});
  EXPECT_TRUE(g.fused_eligible(be));
  set_fused_moe_settings({true, -1});  // the CPU default cap
  EXPECT_TRUE(g.fused_eligible(be));
  EXPECT_GE(be.fused_moe_default_max_dff(), 8192);
}

TEST(FusedMoeSettingsParse, OnOffWords) {
  for (const char* on : {"1", "true", "ON", "yes"}) EXPECT_TRUE(parse_on_off(on, "X"));
  for (const char* off : {"0", "false", "off", "No"}) EXPECT_FALSE(parse_on_off(off, "X"));
  try {
    parse_on_off("maybe", "MOECEL_FUSED_MOE");
    FAIL() << "no error for 'maybe'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MOECEL_FUSED_MOE='maybe'"), std::string::npos) << e.what();
  }
}

// ---- the dispatch trace of the real binary ----

struct Trace {
  int64_t steps = -1, fused = -1, gather = -1;
};

Trace parse_trace(const test::CliResult& r) {
  std::smatch m;
  static const std::regex re("moe dispatch: decode_steps=(\\d+) fused=(\\d+) gather=(\\d+)\n");
  Trace t;
  if (std::regex_search(r.err, m, re)) t = {std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3])};
  return t;
}

struct TraceCase {
  std::string name, make_args, env, gen_args;
  bool expect_fused;
};

class FusedMoeTrace : public ::testing::TestWithParam<TraceCase> {};

TEST_P(FusedMoeTrace, CountsDispatchesOfDecodeSteps) {
  const TraceCase& c = GetParam();
  test::ScratchDir dir("fused-" + c.name);
  const std::string model = dir.str() + "/m";
  const test::CliResult made = test::run_cli("make-test-model --preset tiny --out '" + model + "' " + c.make_args);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  constexpr int kLayers = 2;  // the tiny preset's num_hidden_layers, all MoE
  const std::string cmd = "env MOECEL_TRACE=moe " + c.env + " '" + std::string(MOECEL_BINARY) + "' generate --model '" +
                          model + "' --prompt-ids 1,2,3 --max-tokens 9 --ignore-eos " + c.gen_args;
  test::ScratchDir tmp("trace");
  const int status = std::system((cmd + " >'" + tmp.str() + "/o' 2>'" + tmp.str() + "/e'").c_str());
  test::CliResult t;
  t.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  t.err = test::read_text(tmp.str() + "/e");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const Trace tr = parse_trace(t);
  ASSERT_EQ(tr.steps, 8) << t.err;  // 9 tokens: the first comes from the prefill, 8 decode steps
  if (c.expect_fused) {
    EXPECT_EQ(tr.fused, tr.steps * kLayers) << t.err;
    EXPECT_EQ(tr.gather, 0) << t.err;
  } else {
    EXPECT_EQ(tr.fused, 0) << t.err;
    EXPECT_EQ(tr.gather, tr.steps * kLayers) << t.err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FusedMoeTrace,
    ::testing::Values(TraceCase{"q4", "--bits 4", "", "", true}, TraceCase{"q8", "--bits 8", "", "", true},
                      TraceCase{"down6", "--bits 4 --override switch_mlp.down_proj=6", "", "", true},
                      TraceCase{"q8g32", "--bits 8 --group-size 32", "", "", true},
                      TraceCase{"sampled", "--bits 4", "", "--temperature 0.8 --seed 3", true},
                      TraceCase{"off_env", "--bits 4", "MOECEL_FUSED_MOE=0", "", false},
                      TraceCase{"off_flag", "--bits 4", "", "--fused-moe off", false},
                      TraceCase{"q3", "--bits 3", "", "", false}, TraceCase{"q5", "--bits 5", "", "", false},
                      TraceCase{"down5", "--bits 4 --override switch_mlp.down_proj=5", "", "", false},
                      TraceCase{"groups", "--bits 4 --override switch_mlp.down_proj=4/32", "", "", false},
                      TraceCase{"dff_cap", "--bits 4", "MOECEL_FUSED_MOE_MAX_DFF=64", "", false},
                      TraceCase{"dff_set", "--bits 4 --set '{\"intermediate_size\":192}'",
                                "MOECEL_FUSED_MOE_MAX_DFF=160", "", false},
                      TraceCase{"dense", "--bits 0", "", "", false}),
    [](const ::testing::TestParamInfo<TraceCase>& i) { return i.param.name; });

TEST(FusedMoeTraceCli, PrefillIsNotADecodeStep) {
  test::ScratchDir dir("fused-prefill");
  ASSERT_EQ(test::run_cli("make-test-model --preset tiny --bits 4 --out '" + dir.str() + "/m'").exit_code, 0);
  const std::string cmd = "env MOECEL_TRACE=moe '" + std::string(MOECEL_BINARY) + "' generate --model '" + dir.str() +
                          "/m' --prompt-ids 5 --max-tokens 1 >/dev/null 2>'" + dir.str() + "/e'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  test::CliResult r;
  r.err = test::read_text(dir.str() + "/e");
  const Trace t = parse_trace(r);
  EXPECT_EQ(t.steps, 0) << r.err;
  EXPECT_EQ(t.fused, 0) << r.err;
  EXPECT_EQ(t.gather, 0) << r.err;
}

TEST(FusedMoeTraceCli, UnknownCategoryIsReported) {
  test::ScratchDir dir("trace-category");
  ASSERT_EQ(test::run_cli("make-test-model --preset tiny --bits 4 --out '" + dir.str() + "/m'").exit_code, 0);
  auto run = [&](const std::string& value) {
    const std::string cmd = "env MOECEL_TRACE='" + value + "' '" + std::string(MOECEL_BINARY) + "' generate --model '" +
                            dir.str() + "/m' --prompt-ids 5 --max-tokens 3 --ignore-eos >/dev/null 2>'" + dir.str() +
                            "/e'";
    test::CliResult r;
    r.exit_code = std::system(cmd.c_str());
    r.err = test::read_text(dir.str() + "/e");
    return r;
  };
  // A misspelt category: a warning naming it, no trace line, and the run itself unaffected.
  const test::CliResult typo = run("meo");
  EXPECT_EQ(typo.exit_code, 0) << typo.err;
  EXPECT_NE(typo.err.find("MOECEL_TRACE: unknown category 'meo'"), std::string::npos) << typo.err;
  EXPECT_EQ(typo.err.find("moe dispatch:"), std::string::npos) << typo.err;
  // Beside a known one, the known one still counts.
  const test::CliResult both = run("ops,moe");
  EXPECT_EQ(both.exit_code, 0) << both.err;
  EXPECT_NE(both.err.find("unknown category 'ops'"), std::string::npos) << both.err;
  EXPECT_EQ(parse_trace(both).steps, 2) << both.err;
}

TEST(FusedMoeTraceCli, BadFlagValuesAreErrors) {
  const test::CliResult r = test::run_cli("generate --prompt-ids 1 --max-tokens 1 --fused-moe sometimes");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--fused-moe='sometimes'"), std::string::npos) << r.err;
  // The environment's values are checked before anything is generated: the prompt is not echoed first.
  for (const char* env : {"MOECEL_FUSED_MOE_MAX_DFF=big", "MOECEL_FUSED_MOE=maybe"}) {
    const test::CliResult e = test::run_cli("generate --prompt 'The history of the city' --max-tokens 1", env);
    EXPECT_EQ(e.exit_code, 1) << env << ": " << e.err;
    EXPECT_EQ(e.out, "") << env;
    const std::string name = std::string(env).substr(0, std::string(env).find('=') + 1);
    EXPECT_NE(e.err.find(name + "'"), std::string::npos) << env << ": " << e.err;
  }
}

}  // namespace
}  // namespace moecel

namespace moecel {
namespace {

// Teacher-forced decode on the bundled trained model (whose routers have near ties): one token at a time,
// fused path on vs off, logits of every step and the in-process dispatch counts.
std::vector<std::vector<float>> decode_logits(Model& m, const std::vector<int32_t>& ids, bool fused) {
  FusedMoeSettings s = fused_moe_settings();
  s.enabled = fused;
  set_fused_moe_settings(s);
  KvCache cache = m.make_cache(int64_t(ids.size()));
  std::vector<std::vector<float>> out;
  for (int32_t id : ids) {
    moe_trace::DecodeStep step;
    const Tensor l = m.forward(std::span<const int32_t>(&id, 1), cache, false);
    out.emplace_back(l.ptr<float>(), l.ptr<float>() + l.numel());
  }
  return out;
}

TEST(FusedMoeBundled, TeacherForcedDecodeMatchesGatherAndIsCounted) {
  const FusedMoeSettings saved = fused_moe_settings();
  CpuBackend be;
  auto model = load_model(std::string(MOECEL_SOURCE_DIR) + "/models/default", be);
  const std::vector<int32_t> ids = {1, 45, 311, 20, 7, 1024, 88, 5, 600, 42, 17, 3000};
  moe_trace::reset();
  const auto fused = decode_logits(*model, ids, true);
  const moe_trace::Counts after_fused = moe_trace::totals();
  const auto gather = decode_logits(*model, ids, false);
  const moe_trace::Counts after_gather = moe_trace::totals();
  set_fused_moe_settings(saved);
  const int64_t steps = int64_t(ids.size()), layers = model->info().n_moe_layers;
  EXPECT_EQ(after_fused.decode_steps, steps);
  EXPECT_EQ(after_fused.fused, steps * layers);
  EXPECT_EQ(after_fused.gather, 0);
  EXPECT_EQ(after_gather.fused - after_fused.fused, 0);
  EXPECT_EQ(after_gather.gather - after_fused.gather, steps * layers);
  ASSERT_EQ(fused.size(), gather.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], gather[i]) << "step " << i;  // same bits on the CPU
}

TEST(FusedMoeBundled, GreedyOutputIdenticalOnAndOff) {
  auto run = [](const char* flag) {
    return test::run_cli(std::string("generate --prompt 'And the LORD spake unto Moses, saying,' --max-tokens 48 ") +
                         "--ignore-eos --fused-moe " + flag);
  };
  const test::CliResult on = run("on"), off = run("off");
  ASSERT_EQ(on.exit_code, 0) << on.err;
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_GT(on.out.size(), 60u);
  EXPECT_EQ(on.out, off.out);
}

}  // namespace
}  // namespace moecel
