// CudaBackend::gather_glu (gate and up in one tensor-core launch with the activation in its epilogue; at decode token
// counts, gate, up and the activation in one bulk-copy matrix-vector launch) against the ops it replaces on the same
// device (bit for bit) and against the CPU oracle; its fallbacks and bad expert indices.
#include "backend_ops_common.h"

namespace moecel {
namespace {

using namespace ops_test;  // NOLINT: the shared fixture, helpers and thresholds

// The Backend default (gather_linear of gate and of up, then glu) run on the CUDA backend.
Tensor glu_by_ops(CudaBackend& cu, const LinearWeight& gate, const LinearWeight& up, Activation act, const Tensor& x,
                  const Tensor& idx) {
  const int64_t n = idx.dim(0), k = idx.dim(1);
  Tensor g = cu.alloc(DType::kF32, {n, k, gate.out});
  Tensor u = cu.alloc(DType::kF32, {n, k, gate.out});
  cu.gather_linear(gate, x, idx, g);
  cu.gather_linear(up, x, idx, u);
  cu.glu(act, g, u, g);
  return g;
}

struct Case {
  int bits, group_size;
  DType sdtype;
  int64_t experts, ffn, hidden, k, n;
  Activation act;
};

void check_case(CudaOps& f, const Case& c, Rng& rng) {
  const std::string what = "bits " + std::to_string(c.bits) + " group " + std::to_string(c.group_size) + " ffn " +
                           std::to_string(c.ffn) + " hidden " + std::to_string(c.hidden) + " n " + std::to_string(c.n) +
                           " act " + std::to_string(int(c.act));
  const LinearWeight gate = make_quant(c.experts, c.ffn, c.hidden, c.bits, c.group_size, c.sdtype, rng);
  const LinearWeight up = make_quant(c.experts, c.ffn, c.hidden, c.bits, c.group_size, c.sdtype, rng);
  Tensor x = host_random(DType::kF32, {c.n, c.hidden}, rng);
  Tensor idx = host_i32({c.n, c.k}, random_experts(c.n, c.k, c.experts, rng));
  Tensor ref = f.cpu.alloc(DType::kF32, {c.n, c.k, c.ffn});
  f.cpu.gather_glu(gate, up, c.act, x, idx, ref);

  CudaBackend& cu = f.cu();
  const LinearWeight dg = cu.to_device(gate), du = cu.to_device(up);
  const Tensor dx = cu.to_device(x), didx = cu.to_device(idx);
  Tensor got = cu.alloc(DType::kF32, {c.n, c.k, c.ffn});
  cu.gather_glu(dg, du, c.act, dx, didx, got);
  const std::vector<float> g = f.down(got), o = f.down(glu_by_ops(cu, dg, du, c.act, dx, didx));
  ASSERT_EQ(g.size(), o.size());
  size_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i) differ += std::memcmp(&g[i], &o[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": values that differ from gather_linear x2 + glu";
  EXPECT_LE(nmse(g, f.down(ref)), kMatmul) << what << " against the CPU";
}

TEST_F(CudaOps, GatherGluMatchesTheOpsItReplaces) {
  Rng rng(301);
  // OLMoE's expert shapes at 512 tokens (the fused launch), then every format, activation and partial tiles.
  check_case(*this, {4, 64, DType::kF16, kExperts, kFfn, kHidden, kTopK, 512, Activation::kSiLU}, rng);
  // Decode: one token (and a few), OLMoE's shapes and an odd one.
  for (int64_t n : {1, 4})
    check_case(*this, {4, 64, DType::kF16, kExperts, kFfn, kHidden, kTopK, n, Activation::kSiLU}, rng);
  check_case(*this, {8, 32, DType::kF32, 5, 200, 96, 3, 1, Activation::kGeLU}, rng);
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (Activation act : {Activation::kSiLU, Activation::kGeLU, Activation::kReLU2}) {
        const DType sd = gs == 32 ? DType::kF32 : gs == 64 ? DType::kBF16 : DType::kF16;
        // ffn 200: a last block of 8 rows of each of gate and up; 37 tokens x 3 slots over 5 experts.
        check_case(*this, {bits, gs, sd, 5, 200, 2 * gs, 3, 37, act}, rng);
      }
    }
  }
}

TEST_F(CudaOps, GatherGluFallsBack) {
  Rng rng(302);
  // Few tokens (matrix-vector kernels), 6-bit (CUDA-core tiles), and MOECEL_CUDA_MMA=fast / 0: the ops one by one,
  // which check_case compares against bit for bit as well.
  check_case(*this, {4, 64, DType::kF16, 8, 96, 128, 2, 3, Activation::kSiLU}, rng);
  check_case(*this, {6, 64, DType::kF16, 8, 96, 128, 2, 40, Activation::kSiLU}, rng);
  for (const char* mode : {"fast", "0"}) {
    setenv("MOECEL_CUDA_MMA", mode, 1);
    Case c{4, 64, DType::kF16, 8, 96, 128, 2, 40, Activation::kSiLU};
    const LinearWeight gate = make_quant(c.experts, c.ffn, c.hidden, c.bits, c.group_size, c.sdtype, rng);
    const LinearWeight up = make_quant(c.experts, c.ffn, c.hidden, c.bits, c.group_size, c.sdtype, rng);
    const LinearWeight dg = cu().to_device(gate), du = cu().to_device(up);
    const Tensor dx = cu().to_device(host_random(DType::kF32, {c.n, c.hidden}, rng));
    const Tensor didx = cu().to_device(host_i32({c.n, c.k}, random_experts(c.n, c.k, c.experts, rng)));
    Tensor got = cu().alloc(DType::kF32, {c.n, c.k, c.ffn});
    cu().gather_glu(dg, du, c.act, dx, didx, got);
    const std::vector<float> g = down(got), o = down(glu_by_ops(cu(), dg, du, c.act, dx, didx));
    unsetenv("MOECEL_CUDA_MMA");
    EXPECT_EQ(0, std::memcmp(g.data(), o.data(), g.size() * 4)) << "MOECEL_CUDA_MMA=" << mode;
  }
}

// At decode token counts the bulk-copy kernel computes gate and up and writes act(gate) * up
// (MOECEL_CUDA_GEMV_BULK_GLU) at 2 or 4 rows per warp, its copies on 1, 4 or 8 barriers (MOECEL_CUDA_GEMV_STAGES, later
// ones issued as earlier ones land): bit for bit the gather products and the glu launch and the same bytes for every
// stage count, within the matrix-product threshold of the CPU; a bad expert index gives NaN rows and the error.
TEST_F(CudaOps, GatherGluDecodeEpilogueMatchesTheOps) {
  const Case cases[] = {{4, 64, DType::kF16, kExperts, kFfn, kHidden, kTopK, 1, Activation::kSiLU},
                        {4, 64, DType::kBF16, kExperts, kFfn, kHidden, kTopK, 3, Activation::kSiLU},
                        {8, 32, DType::kF32, 5, 200, 96, 3, 1, Activation::kGeLU},  // a last tile of 8 rows
                        {4, 128, DType::kF16, 6, 64, 256, 2, 2, Activation::kReLU2}};
  std::vector<float> one_stage[2][std::size(cases)];  // [rows per warp][case], with MOECEL_CUDA_GEMV_STAGES=1
  for (const char* stages : {"1", "4", "8"}) {
    for (int ri = 0; ri < 2; ++ri) {
      const char* rows = ri == 0 ? "2" : "4";
      Rng rng(304);  // the same weights and indices for every stage count
      setenv("MOECEL_CUDA_GEMV_BULK_GLU", rows, 1);
      setenv("MOECEL_CUDA_GEMV_STAGES", stages, 1);
      // Some stages' copies go out only as earlier stages land.
      setenv("MOECEL_CUDA_GEMV_DEPTH", std::string(stages) == "8" ? "1" : "2", 1);
      CudaBackend be;
      unsetenv("MOECEL_CUDA_GEMV_BULK_GLU");
      unsetenv("MOECEL_CUDA_GEMV_STAGES");
      unsetenv("MOECEL_CUDA_GEMV_DEPTH");
      for (size_t ci = 0; ci < std::size(cases); ++ci) {
        const Case& c = cases[ci];
        const std::string what = std::string("rows per warp ") + rows + " stages " + stages + " bits " +
                                 std::to_string(c.bits) + " ffn " + std::to_string(c.ffn) + " n " + std::to_string(c.n);
        const LinearWeight gate = make_quant(c.experts, c.ffn, c.hidden, c.bits, c.group_size, c.sdtype, rng);
        const LinearWeight up = make_quant(c.experts, c.ffn, c.hidden, c.bits, c.group_size, c.sdtype, rng);
        Tensor x = host_random(DType::kF32, {c.n, c.hidden}, rng);
        std::vector<int32_t> ids = random_experts(c.n, c.k, c.experts, rng);
        Tensor ref = cpu.alloc(DType::kF32, {c.n, c.k, c.ffn});
        cpu.gather_glu(gate, up, c.act, x, host_i32({c.n, c.k}, ids), ref);
        const LinearWeight dg = be.to_device(gate), du = be.to_device(up);
        const Tensor dx = be.to_device(x), didx = be.to_device(host_i32({c.n, c.k}, ids));
        Tensor got = be.alloc(DType::kF32, {c.n, c.k, c.ffn});
        be.gather_glu(dg, du, c.act, dx, didx, got);
        const std::vector<float> g = dev_vec<float>(be, got),
                                 o = dev_vec<float>(be, glu_by_ops(be, dg, du, c.act, dx, didx));
        EXPECT_EQ(0, std::memcmp(g.data(), o.data(), g.size() * 4)) << what << ": differs from the products + glu";
        EXPECT_LE(nmse(g, host_vec(ref)), kMatmul) << what << " against the CPU";
        if (std::string(stages) == "1") one_stage[ri][ci] = g;
        ASSERT_EQ(g.size(), one_stage[ri][ci].size()) << what;
        EXPECT_EQ(0, std::memcmp(g.data(), one_stage[ri][ci].data(), g.size() * 4)) << what << ": differs from 1 stage";
        ids[1] = int32_t(c.experts);  // slot 1 of token 0
        be.gather_glu(dg, du, c.act, dx, be.to_device(host_i32({c.n, c.k}, ids)), got);
        EXPECT_THROW(be.synchronize(), Error) << what;
        const std::vector<float> bad = dev_vec<float>(be, got);
        EXPECT_TRUE(std::isnan(bad[size_t(c.ffn)]) && std::isnan(bad[size_t(2 * c.ffn - 1)])) << what;
        EXPECT_FALSE(std::isnan(bad[0])) << what;
      }
    }
  }
}

// The down product directly after the decode gather glu kernel of the same indices reads its experts and issues its
// weight copies before its wait (MOECEL_CUDA_PDL_EARLY bit 4, on by default): bit for bit the product without it and
// within the matrix threshold of the CPU; a bad expert index still gives NaN rows and the error at sync.
TEST_F(CudaOps, GatherDownAfterGluMatchesWithoutEarlyExperts) {
  Rng rng(305);
  const LinearWeight gate = make_quant(kExperts, kFfn, kHidden, 4, 64, DType::kBF16, rng);
  const LinearWeight up = make_quant(kExperts, kFfn, kHidden, 4, 64, DType::kBF16, rng);
  const LinearWeight down = make_quant(kExperts, kHidden, kFfn, 4, 64, DType::kBF16, rng);
  const Tensor x = host_random(DType::kF32, {1, kHidden}, rng);
  std::vector<int32_t> ids = random_experts(1, kTopK, kExperts, rng);
  const Tensor idx = host_i32({1, kTopK}, ids);
  Tensor act = cpu.alloc(DType::kF32, {1, kTopK, kFfn}), ref = cpu.alloc(DType::kF32, {kTopK, kHidden});
  cpu.gather_glu(gate, up, Activation::kSiLU, x, idx, act);
  cpu.gather_linear(down, act, idx, ref);
  std::vector<float> outs[3];
  for (int early = 0; early < 3; ++early) {  // 2: early experts and the copies on 4 barriers
    setenv("MOECEL_CUDA_PDL_EARLY", early ? "6" : "0", 1);
    setenv("MOECEL_CUDA_GEMV_STAGES", early == 2 ? "4" : "1", 1);
    setenv("MOECEL_CUDA_GEMV_STAGES_DOWN", early == 2 ? "4" : "1", 1);
    setenv("MOECEL_CUDA_GEMV_DEPTH", "1", 1);
    CudaBackend be;
    unsetenv("MOECEL_CUDA_PDL_EARLY");
    unsetenv("MOECEL_CUDA_GEMV_STAGES");
    unsetenv("MOECEL_CUDA_GEMV_STAGES_DOWN");
    unsetenv("MOECEL_CUDA_GEMV_DEPTH");
    const LinearWeight dg = be.to_device(gate), du = be.to_device(up), dd = be.to_device(down);
    const Tensor dx = be.to_device(x), didx = be.to_device(idx);
    Tensor a = be.alloc(DType::kF32, {1, kTopK, kFfn}), y = be.alloc(DType::kF32, {kTopK, kHidden});
    be.gather_glu(dg, du, Activation::kSiLU, dx, didx, a);
    be.gather_linear(dd, a, didx, y);
    outs[early] = dev_vec<float>(be, y);
    std::vector<int32_t> bad_ids = ids;
    bad_ids[1] = int32_t(kExperts);
    const Tensor bad = be.to_device(host_i32({1, kTopK}, bad_ids));
    be.gather_glu(dg, du, Activation::kSiLU, dx, bad, a);
    be.gather_linear(dd, a, bad, y);
    EXPECT_THROW(be.synchronize(), Error) << "early " << early;
    const std::vector<float> got = dev_vec<float>(be, y);
    EXPECT_TRUE(std::isnan(got[size_t(kHidden)]) && std::isnan(got[size_t(2 * kHidden - 1)])) << "early " << early;
    EXPECT_FALSE(std::isnan(got[0])) << "early " << early;
  }
  EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * 4)) << "copies on 4 barriers";
  EXPECT_LE(nmse(outs[1], host_vec(ref)), kMatmul);
}

TEST_F(CudaOps, GatherGluBadExpertIndexIsReportedAtSync) {
  Rng rng(303);
  const LinearWeight g = cu().to_device(make_quant(4, 32, 64, 4, 32, DType::kF16, rng));
  const LinearWeight u = cu().to_device(make_quant(4, 32, 64, 4, 32, DType::kF16, rng));
  const int64_t n = 9;  // the routed, fused launch
  std::vector<int32_t> ids(size_t(n * 2), 1);
  ids[1] = 4;
  Tensor got = cu().alloc(DType::kF32, {n, 2, 32});
  cu().gather_glu(g, u, Activation::kSiLU, cu().to_device(host_random(DType::kF32, {n, 64}, rng)),
                  cu().to_device(host_i32({n, 2}, ids)), got);
  EXPECT_THROW(cu().synchronize(), Error);
  const std::vector<float> v = down(got);
  EXPECT_TRUE(std::isnan(v[32])) << "the bad pair's row is NaN";
  EXPECT_FALSE(std::isnan(v[0]));
}

}  // namespace
}  // namespace moecel
