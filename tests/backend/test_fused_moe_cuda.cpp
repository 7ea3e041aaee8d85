// The fused decode-MoE path on the CUDA backend: against an all-f32 reference from MLX's dequantization
// (normalized RMS <= 5e-4), against the CUDA gather path (within f32 rounding with the tensor-core kernel A, the
// default; bit-identical with kernel A on CUDA cores: same per-row arithmetic), bitwise reruns, launch widths (rows
// per warp) and kernel variants (kernel B without early weight loads, PDL off, the register-prefetch kernels instead
// of the bulk-copy ones), NaN-free
// output, bad expert indices, and the dispatch counts of decode steps replayed from a CUDA graph. Skips with "no CUDA
// device" without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../model/moe_reference.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "models/moe_dispatch.h"
#include "models/registry.h"
#include "models/switch_glu.h"
#include "models/test_model.h"
#include "quant/affine.h"
#include "runtime/generate.h"

namespace moecel {
namespace {

using Case = test::MoeCase;
using Problem = test::MoeProblem;

class FusedMoeCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  }
};

// Runs one path on a fresh CUDA backend, created with the environment settings `env` ("NAME=VALUE NAME=VALUE ...",
// "" = none).
std::vector<float> run_cuda(const Problem& p, Activation act, bool fused, const std::string& env = "") {
  std::vector<std::string> names;
  std::istringstream settings(env);
  for (std::string kv; settings >> kv;) {
    const size_t eq = kv.find('=');
    names.push_back(kv.substr(0, eq));
    setenv(names.back().c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  CudaBackend be;
  for (const std::string& name : names) unsetenv(name.c_str());
  SwitchWeights dw{be.to_device(p.w.gate), be.to_device(p.w.up), be.to_device(p.w.down)};
  const int64_t hidden = p.w.gate.in, k = int64_t(p.idx.size());
  Tensor x = be.alloc(DType::kF32, {1, hidden}), idx = be.alloc(DType::kI32, {1, k});
  Tensor wts = be.alloc(DType::kF32, {1, k});
  be.from_host(p.x.data(), x);
  be.from_host(p.idx.data(), idx);
  be.from_host(p.route_w.data(), wts);
  const SwitchGLU glu(dw, act);
  EXPECT_TRUE(!fused || glu.fused_eligible(be));
  const Tensor out = fused ? glu.forward_fused(be, x, idx, wts) : glu.forward_gather(be, x, idx, wts);
  std::vector<float> v(static_cast<size_t>(hidden));
  be.to_host(out, v.data());
  be.synchronize();
  return v;
}

TEST_P(FusedMoeCuda, MatchesReferenceGatherAndIsDeterministic) {
  const Case c = GetParam();
  const Problem p = test::make_moe_problem(c, 11 + c.gate_bits * 10 + c.down_bits + c.group_size + c.hidden);
  const std::vector<float> fused = run_cuda(p, c.act, true);
  for (float v : fused) ASSERT_TRUE(std::isfinite(v));
  const std::vector<float> ref = test::moe_reference(p, c.act), gather = run_cuda(p, c.act, false);
  EXPECT_LE(test::normalized_rms(fused, ref), 5e-4);
  EXPECT_EQ(fused, run_cuda(p, c.act, true)) << "rerun differs";
  EXPECT_EQ(fused, run_cuda(p, c.act, true, "MOECEL_CUDA_PDL=0")) << "without programmatic dependent launch";
  // The default kernels A and B multiply on tensor cores (where they apply): the same products in another order of f32
  // additions, so they agree with the gather path to f32 rounding, not bit for bit.
  EXPECT_LE(test::normalized_rms(fused, gather), 1e-5) << "fused and gather paths differ beyond f32 rounding";
  // The tensor-core kernels wherever they apply (the default takes kernel A's only for large grids).
  const std::vector<float> tc = run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2");
  EXPECT_LE(test::normalized_rms(tc, ref), 5e-4);
  EXPECT_LE(test::normalized_rms(tc, gather), 1e-5) << "tensor-core fused and gather paths differ beyond f32 rounding";
  EXPECT_EQ(tc, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2")) << "tensor-core rerun differs";
  // The bf16 operand instead of the int8 one (bulk_imma.cuh: x as 31-bit fixed point, exact integer products).
  const std::vector<float> bf = run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2 MOECEL_CUDA_FUSED_IMMA=0");
  EXPECT_LE(test::normalized_rms(bf, ref), 5e-4);
  EXPECT_LE(test::normalized_rms(bf, tc), 1e-5) << "int8 and bf16 operands differ beyond f32 rounding";
  // Without the rotated group loads (tile_groups_mma): kernel B's sums are the same, kernel A's warps add other groups.
  const std::vector<float> tc0 =
      run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2 MOECEL_CUDA_FUSED_IMMA=0 MOECEL_CUDA_FUSED_ROTATE=0");
  EXPECT_LE(test::normalized_rms(tc0, ref), 5e-4);
  // (4-bit codes enter the MMAs as 128 + q, so a group's f32 sums round ~16x coarser than centered codes' would.)
  EXPECT_LE(test::normalized_rms(tc0, bf), 1e-5) << "rotated and plain group loads differ beyond f32 rounding";
  // Kernels A and B with only the shared memory they use (more blocks per SM): the same sums.
  EXPECT_EQ(tc, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2 MOECEL_CUDA_FUSED_SMEM_FILL=0")) << "no SM fill";
  // Kernel A with its L2 requests of kernel B's rows (off by default): the same sums.
  EXPECT_EQ(tc, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2 MOECEL_CUDA_FUSED_L2_DOWN=1")) << "L2 requests";
  // Kernels A and B on CUDA cores, in every launch width and variant, are the gather path bit for bit.
  const std::vector<float> cores = run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=0");
  EXPECT_EQ(cores, gather) << "fused (CUDA-core kernels) and gather paths differ";
  EXPECT_EQ(cores, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=0 MOECEL_CUDA_FUSED_ROWS=1"))
      << "1 row per warp differs";
  EXPECT_EQ(cores, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=0 MOECEL_CUDA_FUSED_ROWS=4"))
      << "4 rows per warp differs";
  EXPECT_EQ(cores, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=0 MOECEL_CUDA_FUSED_ROWS=0"))
      << "the pipelined kernel A differs";
  EXPECT_EQ(cores, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_BULK=0")) << "the register-prefetch kernels differ";
  EXPECT_EQ(cores, run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=0 MOECEL_CUDA_FUSED_B_PREFETCH=0"))
      << "kernel B without prefetch differs";
  // With the tensor-core matrix-vector kernels (opt-in), both paths run them, and still agree bit for bit.
  const std::vector<float> mma = run_cuda(p, c.act, true, "MOECEL_CUDA_DECODE_MMA=1");
  for (float v : mma) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LE(test::normalized_rms(mma, test::moe_reference(p, c.act)), 5e-4);
  EXPECT_EQ(mma, run_cuda(p, c.act, false, "MOECEL_CUDA_DECODE_MMA=1")) << "tensor-core fused and gather paths differ";
}

INSTANTIATE_TEST_SUITE_P(
    Formats, FusedMoeCuda,
    ::testing::Values(Case{4, 4, 64, 64, 2048, 1024, 8, Activation::kSiLU, DType::kBF16},  // OLMoE-1B-7B
                      Case{4, 4, 64, 64, 2048, 1024, 8, Activation::kSiLU, DType::kF16},
                      Case{8, 8, 64, 64, 2048, 1024, 8, Activation::kSiLU, DType::kBF16},
                      Case{4, 6, 64, 64, 2048, 1024, 8, Activation::kSiLU, DType::kBF16},
                      Case{8, 4, 32, 16, 1024, 512, 4, Activation::kSiLU, DType::kF32},
                      Case{4, 8, 128, 16, 2048, 768, 8, Activation::kSiLU, DType::kBF16},  // Qwen3-30B-A3B
                      Case{4, 4, 64, 20, 4096, 1408, 6, Activation::kSiLU, DType::kBF16},  // dots1-like, k 6
                      Case{4, 4, 32, 8, 96, 160, 3, Activation::kGeLU, DType::kBF16},
                      Case{8, 6, 64, 8, 128, 64, 2, Activation::kReLU2, DType::kF16},
                      Case{4, 4, 64, 64, 256, 128, 12, Activation::kSiLU, DType::kBF16},  // k > one slot batch
                      Case{4, 4, 64, 4, 128, 64, 1, Activation::kSiLU, DType::kBF16}));

TEST_F(FusedMoeCuda, BadExpertIndexRaisesOnSync) {
  // Group size 32 and bf16 scales: 16-byte rows of scales, so the bulk-copy kernels take it by default.
  const Case c{4, 4, 32, 8, 256, 256, 2, Activation::kSiLU, DType::kBF16};
  Problem p = test::make_moe_problem(c, 5);
  p.idx[1] = 8;  // one past the last expert
  for (const std::string env : {"", "MOECEL_CUDA_DECODE_MMA=1", "MOECEL_CUDA_FUSED_BULK=0"}) {
    for (bool fused : {true, false}) {
      try {
        run_cuda(p, c.act, fused, env);
        ADD_FAILURE() << "no error for an expert index out of range (" << env << (fused ? " fused)" : " gather)");
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expert"), std::string::npos) << e.what();
      }
    }
  }
}

// The int8 operand scales the vector by a power of two from its largest value (bulk_imma.cuh): vectors far from 1 and
// one with an outlier 1000x the rest agree with the gather path to f32 rounding.
TEST_F(FusedMoeCuda, Int8OperandKeepsWideRangeVectors) {
  const Case c{4, 4, 64, 16, 2048, 1024, 8, Activation::kSiLU, DType::kBF16};
  for (const float scale : {1e-12f, 1.0f, 1e12f}) {
    Problem p = test::make_moe_problem(c, 29);
    for (float& v : p.x) v *= scale;
    p.x[5] *= 1000.0f;
    const std::vector<float> gather = run_cuda(p, c.act, false);
    const std::vector<float> i8 = run_cuda(p, c.act, true, "MOECEL_CUDA_FUSED_MMA=2");
    for (float v : i8) ASSERT_TRUE(std::isfinite(v)) << "scale " << scale;
    EXPECT_LE(test::normalized_rms(i8, gather), 1e-5) << "scale " << scale;
    EXPECT_LE(test::normalized_rms(i8, test::moe_reference(p, c.act)), 5e-4) << "scale " << scale;
  }
}

// Decode steps replayed from a CUDA graph count the fused dispatches recorded in it, once per step, and give the
// same greedy ids as the gather path.
TEST_F(FusedMoeCuda, GraphReplaysCountFusedDispatches) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("moecel-fused-graph-" + std::to_string(::getpid()));
  TestModelOptions opt;
  opt.bits = 4;
  opt.seed = 3;
  opt.config_overrides = {{"hidden_size", 512},       {"num_attention_heads", 4}, {"num_key_value_heads", 4},
                          {"intermediate_size", 256}, {"num_experts", 16},        {"num_experts_per_tok", 4},
                          {"num_hidden_layers", 3},   {"vocab_size", 1000},       {"eos_token_id", 999}};
  write_test_model(opt, dir.string());
  const FusedMoeSettings saved = fused_moe_settings();
  auto ids_for = [&](bool fused, moe_trace::Counts* counts) {
    set_fused_moe_settings({fused, -1});
    CudaBackend be;
    auto model = load_model(dir.string(), be);
    KvCache cache = model->make_cache(32);
    GreedyStepper stepper(*model, cache);
    moe_trace::reset();
    std::vector<int32_t> ids{7};
    for (int i = 0; i < 20; ++i) ids.push_back(stepper.step(ids.back()));
    EXPECT_TRUE(stepper.uses_graph());
    *counts = moe_trace::totals();
    return ids;
  };
  moe_trace::Counts on{}, off{};
  const std::vector<int32_t> a = ids_for(true, &on), b = ids_for(false, &off);
  set_fused_moe_settings(saved);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(on.decode_steps, 20);
  EXPECT_EQ(on.fused, 20 * 3);
  EXPECT_EQ(on.gather, 0);
  EXPECT_EQ(off.fused, 0);
  EXPECT_EQ(off.gather, 20 * 3);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace moecel
