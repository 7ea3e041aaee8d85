// The decode-step fusions of the CUDA backend (rms_norm_linears, linear_residual, rms_norm_router,
// fused_moe_add, qk_norm_rope_attention) and the multi-block argmax. Each fused launch is checked against the CPU
// backend (the oracle, running the ops one by one) and, bit for bit, against the same ops run one by one on the CUDA
// backend: the fusions save launches and must not change a single result.
#include <span>

#include "backend_ops_common.h"
#include "models/switch_glu.h"

namespace moecel::ops_test {
namespace {

struct NormCase {
  int bits, group_size;
  DType scale_type;
  std::vector<int64_t> outs;  // one weight per entry (1 to 3)
  int64_t in;
};

TEST_F(CudaOps, RmsNormLinearsMatchCpuAndUnfusedCuda) {
  Rng rng(101);
  const std::vector<NormCase> cases = {
      {4, 64, DType::kBF16, {kHidden, kHidden, kHidden}, kHidden},  // OLMoE q, k, v
      {8, 64, DType::kF16, {kHidden, 512, 512}, kHidden},           // GQA widths
      {4, 32, DType::kF32, {13, 70}, 96},                           // odd rows, partial blocks
      {6, 128, DType::kBF16, {40}, 256},                            // one part, 6-bit
  };
  for (const NormCase& c : cases) {
    std::vector<LinearWeight> host_w, dev_w;
    for (int64_t out : c.outs) {
      host_w.push_back(make_quant(0, out, c.in, c.bits, c.group_size, c.scale_type, rng));
      dev_w.push_back(cu().to_device(host_w.back()));
    }
    Tensor norm = host_random(DType::kBF16, {c.in}, rng, 0.5f, 1.5f);
    Tensor dnorm = cu().to_device(norm);
    for (int64_t n : {1, 3, 4, 6}) {  // 6: more tokens than the matrix-vector kernel takes (the ops one by one)
      const std::string what = "bits " + std::to_string(c.bits) + " parts " + std::to_string(c.outs.size()) + " in " +
                               std::to_string(c.in) + " n " + std::to_string(n);
      Tensor x = host_random(DType::kF32, {n, c.in}, rng, -3.0f, 3.0f);
      Tensor dx = cu().to_device(x);
      // CPU oracle.
      Tensor cxn = cpu.alloc(DType::kF32, {n, c.in});
      cpu.rms_norm(x, norm, 1e-5f, cxn);
      // Fused on the GPU.
      std::vector<Tensor> ys;
      std::vector<Tensor*> y_ptrs;
      std::vector<const LinearWeight*> w_ptrs;
      for (size_t i = 0; i < c.outs.size(); ++i) ys.push_back(cu().alloc(DType::kF32, {n, c.outs[i]}));
      for (size_t i = 0; i < c.outs.size(); ++i) {
        y_ptrs.push_back(&ys[i]);
        w_ptrs.push_back(&dev_w[i]);
      }
      Tensor xn = cu().alloc(DType::kF32, {n, c.in});
      cu().rms_norm_linears(dx, dnorm, 1e-5f, w_ptrs, y_ptrs, &xn);
      // Unfused on the GPU.
      Tensor uxn = cu().alloc(DType::kF32, {n, c.in});
      cu().rms_norm(dx, dnorm, 1e-5f, uxn);
      EXPECT_EQ(down(xn), down(uxn)) << what << ": normalized x differs from rms_norm";
      EXPECT_LE(nmse(down(xn), host_vec(cxn)), kElementwise) << what;
      for (size_t i = 0; i < c.outs.size(); ++i) {
        Tensor ref = cpu.alloc(DType::kF32, {n, c.outs[i]});
        cpu.linear(host_w[i], cxn, ref);
        Tensor uy = cu().alloc(DType::kF32, {n, c.outs[i]});
        cu().linear(dev_w[i], uxn, uy);
        EXPECT_EQ(down(ys[i]), down(uy)) << what << " part " << i << ": fused differs from rms_norm + linear";
        EXPECT_LE(nmse(down(ys[i]), host_vec(ref)), kMatmul) << what << " part " << i;
      }
    }
  }
}

// One token of rms_norm_linears through the bulk-copy kernel (MOECEL_CUDA_GEMV_BULK = 2 or 4 rows per warp, with a
// partial last tile of 8 rows) and through the register-prefetch kernel (0): bit for bit the ops one by one.
TEST_F(CudaOps, RmsNormLinearsBulkKernelMatchesTheOps) {
  for (const char* bulk : {"0", "2", "4"}) {
    setenv("MOECEL_CUDA_GEMV_BULK", bulk, 1);
    CudaBackend be;
    unsetenv("MOECEL_CUDA_GEMV_BULK");
    auto get = [&](const Tensor& t) { return dev_vec<float>(be, t); };
    Rng rng(108);
    const std::vector<NormCase> cases = {
        {4, 64, DType::kF16, {kHidden, kHidden, kHidden}, kHidden},  // OLMoE q, k, v
        {8, 32, DType::kBF16, {24, 40}, 512},                        // tiles of 8 rows at the end
        {4, 128, DType::kF32, {kHidden}, 4096},
    };
    for (const NormCase& c : cases) {
      std::vector<LinearWeight> host_w, dev_w;
      for (int64_t out : c.outs) {
        host_w.push_back(make_quant(0, out, c.in, c.bits, c.group_size, c.scale_type, rng));
        dev_w.push_back(be.to_device(host_w.back()));
      }
      Tensor norm = host_random(DType::kBF16, {c.in}, rng, 0.5f, 1.5f);
      Tensor dnorm = be.to_device(norm), x = host_random(DType::kF32, {1, c.in}, rng, -3.0f, 3.0f);
      Tensor dx = be.to_device(x);
      std::vector<Tensor> ys;
      std::vector<Tensor*> y_ptrs;
      std::vector<const LinearWeight*> w_ptrs;
      for (size_t i = 0; i < c.outs.size(); ++i) ys.push_back(be.alloc(DType::kF32, {1, c.outs[i]}));
      for (size_t i = 0; i < c.outs.size(); ++i) {
        y_ptrs.push_back(&ys[i]);
        w_ptrs.push_back(&dev_w[i]);
      }
      Tensor xn = be.alloc(DType::kF32, {1, c.in}), uxn = be.alloc(DType::kF32, {1, c.in});
      be.rms_norm_linears(dx, dnorm, 1e-5f, w_ptrs, y_ptrs, &xn);
      be.rms_norm(dx, dnorm, 1e-5f, uxn);
      const std::string what =
          std::string("bulk ") + bulk + " bits " + std::to_string(c.bits) + " in " + std::to_string(c.in);
      EXPECT_EQ(get(xn), get(uxn)) << what;
      Tensor cxn = cpu.alloc(DType::kF32, {1, c.in});
      cpu.rms_norm(x, norm, 1e-5f, cxn);
      for (size_t i = 0; i < c.outs.size(); ++i) {
        Tensor uy = be.alloc(DType::kF32, {1, c.outs[i]}), ref = cpu.alloc(DType::kF32, {1, c.outs[i]});
        be.linear(dev_w[i], uxn, uy);
        cpu.linear(host_w[i], cxn, ref);
        EXPECT_EQ(get(ys[i]), get(uy)) << what << " part " << i;
        EXPECT_LE(nmse(get(ys[i]), host_vec(ref)), kMatmul) << what << " part " << i;
      }
    }
  }
}

// One token of a large rms_norm_linears (the vocabulary projection's shape class: the streaming kernel, 2 to 4 ring
// slots, tiles that wrap the ring and a short last tile) against the bulk-copy kernel it replaces (streaming and
// tensor-core kernels off): bit for bit with CUDA-core sums (MOECEL_CUDA_GEMV_STREAM_MMA=0), and within the CPU's
// rounding. Its tensor-core walk (the default where out is whole 32-row tiles; x as the int8 operand or as bf16
// planes) gives other bits: within the CPU's rounding, and not bit for bit the bulk kernel's (proof that it ran).
TEST_F(CudaOps, RmsNormLinearStreamKernelMatchesTheBulkKernel) {
  struct Case {
    int bits, group_size;
    DType scale_type;
    int64_t out, in;
    bool mma;  // the tensor-core walk takes it
  };
  const std::vector<Case> cases = {
      {4, 64, DType::kF16, 16392, 256, false},   // a last tile of 8 rows
      {8, 32, DType::kBF16, 20000, 512, true},   // 8-bit
      {4, 128, DType::kF32, 16416, 2048, true},  // one group per rotation round
      {4, 64, DType::kF16, 16384, 2048, true},   // OLMoE's lm_head shape class
  };
  auto run = [&](const char* stream, const char* mma, const char* stream_mma, const Case& c, const LinearWeight& hw,
                 const Tensor& norm, const Tensor& x) {
    setenv("MOECEL_CUDA_GEMV_STREAM", stream, 1);
    setenv("MOECEL_CUDA_DECODE_MMA", mma, 1);
    setenv("MOECEL_CUDA_GEMV_STREAM_MMA", stream_mma, 1);
    CudaBackend be;
    for (const char* name : {"MOECEL_CUDA_GEMV_STREAM", "MOECEL_CUDA_DECODE_MMA", "MOECEL_CUDA_GEMV_STREAM_MMA"}) {
      unsetenv(name);
    }
    const LinearWeight dw = be.to_device(hw);
    const Tensor dnorm = be.to_device(norm), dx = be.to_device(x);
    Tensor y = be.alloc(DType::kF32, {1, c.out}), xn = be.alloc(DType::kF32, {1, c.in});
    Tensor* ys[] = {&y};
    const LinearWeight* ws[] = {&dw};
    be.rms_norm_linears(dx, dnorm, 1e-5f, ws, ys, &xn);
    return dev_vec<float>(be, y);
  };
  Rng rng(109);
  for (const Case& c : cases) {
    const LinearWeight hw = make_quant(0, c.out, c.in, c.bits, c.group_size, c.scale_type, rng);
    const Tensor norm = host_random(DType::kBF16, {c.in}, rng, 0.5f, 1.5f);
    const Tensor x = host_random(DType::kF32, {1, c.in}, rng, -3.0f, 3.0f);
    Tensor cxn = cpu.alloc(DType::kF32, {1, c.in}), ref = cpu.alloc(DType::kF32, {1, c.out});
    cpu.rms_norm(x, norm, 1e-5f, cxn);
    cpu.linear(hw, cxn, ref);
    const std::string what =
        "bits " + std::to_string(c.bits) + " out " + std::to_string(c.out) + " in " + std::to_string(c.in);
    const std::vector<float> bulk = run("0", "0", "0", c, hw, norm, x);
    ASSERT_EQ(bulk.size(), size_t(c.out));
    EXPECT_LE(nmse(bulk, host_vec(ref)), kMatmul) << "bulk kernel, " << what;
    for (const char* slots : {"2", "3", "4"}) {
      const std::vector<float> y = run(slots, "2", "0", c, hw, norm, x);
      EXPECT_EQ(y, bulk) << "slots " << slots << ", " << what;
      for (const char* operand : {"1", "2"}) {  // x as the int8 operand (the default), as bf16 planes
        const std::vector<float> t = run(slots, "2", operand, c, hw, norm, x);
        const std::string how = std::string("tensor cores ") + operand + ", slots " + slots + ", " + what;
        ASSERT_EQ(t.size(), bulk.size());
        EXPECT_LE(nmse(t, host_vec(ref)), kMatmul) << how;
        EXPECT_LE(nmse(t, bulk), kMatmul) << how;
        if (c.mma) {
          EXPECT_NE(t, bulk) << how << ": bit for bit the CUDA-core sums";
        } else {
          EXPECT_EQ(t, bulk) << how << ": no tensor-core walk for this shape";
        }
      }
    }
  }
}

// A greedy step's tail in one launch (rms_norm_linear_argmax: the streaming kernel's last block finds the id) against
// rms_norm_linears then argmax_to: the same logits bit for bit and the same id, also where the maximum is tied
// (copies of the best row before and after it: the lowest index wins). With argmax_kernel skipped the id is still
// written (proof that the tail found it); shapes the streaming kernel declines take the two ops.
TEST_F(CudaOps, RmsNormLinearArgmaxMatchesTheTwoOps) {
  struct Case {
    int bits, group_size;
    DType scale_type;
    int64_t out, in;
    bool tail;  // the streaming kernel takes it
  };
  const std::vector<Case> cases = {
      {4, 64, DType::kF16, 16392, 256, true},   // CUDA-core walk, a last tile of 8 rows
      {8, 32, DType::kBF16, 20000, 512, true},  // 8-bit, tensor cores
      {4, 64, DType::kF16, 16384, 2048, true},  // OLMoE's lm_head shape class
      {4, 64, DType::kBF16, 300, 128, false},   // too few rows to stream
  };
  // Copies row `from` of a quantized weight over row `to` (codes, scales and biases).
  auto copy_row = [](LinearWeight& w, int64_t from, int64_t to) {
    for (Tensor* t : {&w.weight, &w.scales, &w.biases}) {
      const size_t row = t->nbytes() / size_t(w.out);
      auto* base = static_cast<unsigned char*>(t->data);
      std::memcpy(base + size_t(to) * row, base + size_t(from) * row, row);
    }
  };
  struct Out {
    std::vector<float> logits;
    int32_t id;
  };
  auto run = [&](bool fused, const char* env, const char* stream_mma, const Case& c, const LinearWeight& hw,
                 const Tensor& norm, const Tensor& x) {
    if (env) setenv("MOECEL_CUDA_SKIP", env, 1);
    setenv("MOECEL_CUDA_GEMV_STREAM_MMA", stream_mma, 1);
    CudaBackend be;
    unsetenv("MOECEL_CUDA_SKIP");
    unsetenv("MOECEL_CUDA_GEMV_STREAM_MMA");
    const LinearWeight dw = be.to_device(hw);
    const Tensor dnorm = be.to_device(norm), dx = be.to_device(x);
    Tensor y = be.alloc(DType::kF32, {1, c.out}), ids = be.alloc(DType::kI32, {1});
    const int32_t none = -1;
    be.from_host(&none, ids);
    if (fused) {
      be.rms_norm_linear_argmax(dx, dnorm, 1e-5f, dw, y, ids);
    } else {
      Tensor* ys[] = {&y};
      const LinearWeight* ws[] = {&dw};
      be.rms_norm_linears(dx, dnorm, 1e-5f, ws, ys, nullptr);
      be.argmax_to(y, ids);
    }
    return Out{dev_vec<float>(be, y), dev_vec<int32_t>(be, ids)[0]};
  };
  Rng rng(113);
  for (const Case& c : cases) {
    LinearWeight hw = make_quant(0, c.out, c.in, c.bits, c.group_size, c.scale_type, rng);
    const Tensor norm = host_random(DType::kBF16, {c.in}, rng, 0.5f, 1.5f);
    const Tensor x = host_random(DType::kF32, {1, c.in}, rng, -3.0f, 3.0f);
    const std::string what =
        "bits " + std::to_string(c.bits) + " out " + std::to_string(c.out) + " in " + std::to_string(c.in);
    int64_t low = -1;  // the first copy of the best row, once tied
    for (int tie = 0; tie < 2; ++tie) {
      for (const char* stream_mma : {"0", "1"}) {
        const std::string how = what + (tie ? ", tied" : "") + ", stream mma " + stream_mma;
        const Out two = run(false, nullptr, stream_mma, c, hw, norm, x);
        ASSERT_EQ(two.logits.size(), size_t(c.out)) << how;
        const int32_t want = int32_t(std::max_element(two.logits.begin(), two.logits.end()) - two.logits.begin());
        if (tie) {
          EXPECT_EQ(want, low) << how << ": the copies' logits are not the best row's";
        }
        EXPECT_EQ(two.id, want) << how;
        const Out one = run(true, nullptr, stream_mma, c, hw, norm, x);
        EXPECT_EQ(one.logits, two.logits) << how;
        EXPECT_EQ(one.id, want) << how;
        const Out skipped = run(true, "argmax_kernel", stream_mma, c, hw, norm, x);
        EXPECT_EQ(skipped.id, c.tail ? want : -1) << how << ": argmax_kernel skipped";
      }
      if (tie == 0) {  // the best row copied to rows before and after it (rows of the same tile and of others)
        const Out two = run(false, nullptr, "1", c, hw, norm, x);
        const int64_t best = std::max_element(two.logits.begin(), two.logits.end()) - two.logits.begin();
        low = best >= 37 ? best - 37 : best / 2;
        const int64_t high = std::min<int64_t>(c.out - 1, best + 5);
        if (low != best) copy_row(hw, best, low);
        if (high != best) copy_row(hw, best, high);
        ASSERT_LT(low, best) << what << ": no earlier row to tie with";
      }
    }
  }
}

// The gather products of a decode step through the bulk-copy kernel (MOECEL_CUDA_GEMV_BULK_GATHER = 2 or 4) and
// through the register-prefetch kernel (0): bit for bit the same, within the CPU's rounding, and a bad expert index
// still gives NaN rows.
TEST_F(CudaOps, GatherLinearBulkKernelMatchesTheOthers) {
  Rng rng(109);
  struct Case {
    int bits, group_size;
    DType stype;
    int64_t out, in;
    bool per_slot;  // x one row per slot (the down projection) or shared by the slots
  };
  const std::vector<Case> cases = {{4, 64, DType::kF16, kFfn, kHidden, false},  // OLMoE gate / up
                                   {4, 64, DType::kBF16, kHidden, kFfn, true},  // OLMoE down
                                   {8, 32, DType::kF32, 40, 256, false}};       // tiles of 8 rows at the end
  for (const Case& c : cases) {
    const LinearWeight w = make_quant(kExperts, c.out, c.in, c.bits, c.group_size, c.stype, rng);
    Tensor x = host_random(DType::kF32, c.per_slot ? Shape{1, kTopK, c.in} : Shape{1, c.in}, rng);
    const std::vector<int32_t> ids = {3, 60, 7, 0, 63, 12, 33, 5};
    Tensor idx = host_i32({1, kTopK}, ids);
    Tensor ref = cpu.alloc(DType::kF32, {1, kTopK, c.out});
    cpu.gather_linear(w, x, idx, ref);
    std::vector<std::vector<float>> got;
    for (const char* bulk : {"0", "2", "4"}) {
      setenv("MOECEL_CUDA_GEMV_BULK_GATHER", bulk, 1);
      CudaBackend be;
      unsetenv("MOECEL_CUDA_GEMV_BULK_GATHER");
      const LinearWeight dw = be.to_device(w);
      Tensor y = be.alloc(DType::kF32, {1, kTopK, c.out});
      be.gather_linear(dw, be.to_device(x), be.to_device(idx), y);
      std::vector<float> v(static_cast<size_t>(y.numel()));
      be.to_host(y, v.data());
      EXPECT_LE(nmse(v, host_vec(ref)), kMatmul) << "bulk " << bulk << " out " << c.out;
      got.push_back(v);
      // An expert index out of range: NaN rows for its slot and the error raised at the next synchronize.
      std::vector<int32_t> bad = ids;
      bad[2] = kExperts;
      be.gather_linear(dw, be.to_device(x), be.to_device(host_i32({1, kTopK}, bad)), y);
      EXPECT_THROW(be.synchronize(), Error) << "bulk " << bulk;
      be.to_host(y, v.data());
      EXPECT_TRUE(std::isnan(v[size_t(2 * c.out)])) << "bulk " << bulk;
    }
    EXPECT_EQ(got[1], got[0]) << "out " << c.out;
    EXPECT_EQ(got[2], got[0]) << "out " << c.out;
  }
}

// The CUDA-core kernel (MOECEL_CUDA_GEMV_RESIDUAL_IMMA=0): bit for bit linear then add. The int8 kernel that takes
// one token by default is tested in test_gemv_imma.cpp.
TEST_F(CudaOps, LinearResidualMatchesLinearThenAdd) {
  setenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA", "0", 1);
  CudaBackend be;
  unsetenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA");
  auto get = [&](const Tensor& t) { return dev_vec<float>(be, t); };
  Rng rng(102);
  for (int bits : {4, 8}) {
    const LinearWeight w = make_quant(0, kHidden, kHidden, bits, 64, DType::kBF16, rng);
    const LinearWeight dw = be.to_device(w);
    for (int64_t n : {1, 2, 5}) {
      Tensor x = host_random(DType::kF32, {n, kHidden}, rng);
      Tensor res = host_random(DType::kF32, {n, kHidden}, rng, -4.0f, 4.0f);
      Tensor ref = cpu.alloc(DType::kF32, {n, kHidden});
      cpu.linear(w, x, ref);
      cpu.add(res, ref, ref);
      Tensor dx = be.to_device(x);
      Tensor fused = be.alloc(DType::kF32, {n, kHidden});
      be.from_host(res.data, fused);
      be.linear_residual(dw, dx, fused);
      Tensor y = be.alloc(DType::kF32, {n, kHidden}), unfused = be.alloc(DType::kF32, {n, kHidden});
      be.linear(dw, dx, y);
      be.add(be.to_device(res), y, unfused);
      const std::string what = "bits " + std::to_string(bits) + " n " + std::to_string(n);
      EXPECT_EQ(get(fused), get(unfused)) << what;
      EXPECT_LE(nmse(get(fused), host_vec(ref)), kMatmul) << what;
    }
  }
}

// Both router variants: the norm fused into the router's launch with a separate top-k kernel (the default), and
// the top-k in that launch's last block (MOECEL_CUDA_FUSIONS bit 8).
TEST_F(CudaOps, RmsNormRouterMatchesTheOpsOneByOne) {
  struct Case {
    int64_t n_experts;
    int k;
    RouterScoring scoring;
    bool renorm;
    int bits;
  };
  for (const char* fusions : {"7", "15"}) {
    setenv("MOECEL_CUDA_FUSIONS", fusions, 1);
    CudaBackend be;
    unsetenv("MOECEL_CUDA_FUSIONS");
    auto get = [&](const Tensor& t) { return dev_vec<float>(be, t); };
    auto get_i = [&](const Tensor& t) { return dev_vec<int32_t>(be, t); };
    Rng rng(103);
    for (const Case& c : {Case{kExperts, int(kTopK), RouterScoring::kSoftmax, false, 4},  // olmoe
                          Case{128, 8, RouterScoring::kSoftmax, true, 8},                 // qwen3_moe (8-bit router)
                          Case{8, 2, RouterScoring::kTopKSoftmax, false, 4},              // mixtral
                          Case{256, 32, RouterScoring::kSoftmax, true, 4},                // the epilogue's limits
                          Case{300, 40, RouterScoring::kSoftmax, false, 4}}) {            // beyond them
      const LinearWeight w = make_quant(0, c.n_experts, kHidden, c.bits, 64, DType::kBF16, rng);
      const LinearWeight dw = be.to_device(w);
      Tensor norm = host_random(DType::kBF16, {kHidden}, rng, 0.5f, 1.5f);
      Tensor dnorm = be.to_device(norm);
      for (int64_t n : {1, 4, 9}) {
        const std::string what = std::string("fusions ") + fusions + " experts " + std::to_string(c.n_experts) + " k " +
                                 std::to_string(c.k) + " n " + std::to_string(n);
        for (int rep = 0; rep < 3; ++rep) {  // the last-block counter must be back at zero for the next launch
          Tensor x = host_random(DType::kF32, {n, kHidden}, rng, -3.0f, 3.0f);
          Tensor dx = be.to_device(x);
          Tensor xn = be.alloc(DType::kF32, {n, kHidden}), logits = be.alloc(DType::kF32, {n, c.n_experts});
          Tensor idx = be.alloc(DType::kI32, {n, c.k}), wts = be.alloc(DType::kF32, {n, c.k});
          be.rms_norm_router(dx, dnorm, 1e-5f, dw, c.scoring, c.k, c.renorm, xn, logits, idx, wts);
          Tensor uxn = be.alloc(DType::kF32, {n, kHidden}), ulogits = be.alloc(DType::kF32, {n, c.n_experts});
          Tensor uidx = be.alloc(DType::kI32, {n, c.k}), uwts = be.alloc(DType::kF32, {n, c.k});
          be.rms_norm(dx, dnorm, 1e-5f, uxn);
          be.linear(dw, uxn, ulogits);
          be.router_topk(ulogits, c.scoring, c.k, c.renorm, uidx, uwts);
          EXPECT_EQ(get(xn), get(uxn)) << what;
          EXPECT_EQ(get(logits), get(ulogits)) << what;
          EXPECT_EQ(get_i(idx), get_i(uidx)) << what;
          EXPECT_EQ(get(wts), get(uwts)) << what;
          // And against the CPU backend.
          Tensor cxn = cpu.alloc(DType::kF32, {n, kHidden}), clogits = cpu.alloc(DType::kF32, {n, c.n_experts});
          Tensor cidx = cpu.alloc(DType::kI32, {n, c.k}), cwts = cpu.alloc(DType::kF32, {n, c.k});
          cpu.rms_norm_router(x, norm, 1e-5f, w, c.scoring, c.k, c.renorm, cxn, clogits, cidx, cwts);
          EXPECT_LE(nmse(get(logits), host_vec(clogits)), kMatmul) << what;
          EXPECT_EQ(get_i(idx), host_i32_vec(cidx)) << what;
          EXPECT_LE(nmse(get(wts), host_vec(cwts)), kElementwise * 100) << what;  // weights of f32 logits
        }
      }
    }
  }
}

// The o projection with the router's product in its blocks (MOECEL_CUDA_ROUTER_SHARE=1, the default) and one
// launch for the logits, xn and top-k: the residual bit for bit linear_residual's, the rest within f32 rounding of
// the ops one by one (the norm's factor is applied after the sum) and of the CPU; with the knob off, bit for bit
// the ops one by one. Cases beyond its limits (more than 8192 parts, 300 experts, a 6-bit router) take the ops. A
// token of zeros (every logit ties) or of NaN selects the lowest expert indices in order.
TEST_F(CudaOps, LinearResidualNormRouterMatchesTheOps) {
  struct Case {
    int64_t n_experts;
    int k;
    RouterScoring scoring;
    bool renorm;
    int o_bits, r_bits, r_group;
    int64_t o_in;  // attention width: 8 rows per block above 2048, else 16
    DType stype;
    bool shared;  // within the share's limits
  };
  for (const char* share : {"1", "0"}) {
    setenv("MOECEL_CUDA_ROUTER_SHARE", share, 1);
    CudaBackend be;
    unsetenv("MOECEL_CUDA_ROUTER_SHARE");
    auto get = [&](const Tensor& t) { return dev_vec<float>(be, t); };
    auto get_i = [&](const Tensor& t) { return dev_vec<int32_t>(be, t); };
    Rng rng(107);
    const RouterScoring kSm = RouterScoring::kSoftmax;
    for (const Case& c : {Case{kExperts, int(kTopK), kSm, false, 4, 4, 64, kHidden, DType::kBF16, true},  // olmoe
                          Case{32, 4, kSm, true, 8, 8, 32, kHidden, DType::kF16, true},
                          Case{8, 2, RouterScoring::kTopKSoftmax, false, 4, 4, 128, 4096, DType::kF32, true},
                          Case{32, 8, kSm, false, 4, 8, 64, 4096, DType::kBF16, true},  // 256 blocks x 32
                          Case{128, 8, kSm, true, 4, 4, 64, 4096, DType::kF16, false},  // qwen3_moe: 32768 parts
                          Case{300, 40, kSm, false, 4, 4, 64, kHidden, DType::kBF16, false},
                          Case{16, 4, kSm, false, 4, 6, 64, kHidden, DType::kBF16, false}}) {
      const LinearWeight o = make_quant(0, kHidden, c.o_in, c.o_bits, 64, c.stype, rng);
      const LinearWeight r = make_quant(0, c.n_experts, kHidden, c.r_bits, c.r_group, c.stype, rng);
      const LinearWeight dov = be.to_device(o), drv = be.to_device(r);
      Tensor norm = host_random(DType::kBF16, {kHidden}, rng, 0.5f, 1.5f);
      Tensor dnorm = be.to_device(norm);
      for (int64_t n : {1, 4, 9, 0, -1}) {
        const float flat = n == 0 ? 0.0f : NAN;  // n 0 / -1: one token of zeros (all logits tie) or of NaN
        const bool special = n <= 0;
        if (special) n = 1;
        const std::string key = "experts " + std::to_string(c.n_experts) + " router bits " + std::to_string(c.r_bits) +
                                " o in " + std::to_string(c.o_in) + " n " + std::to_string(n) +
                                (special ? std::to_string(flat) : "");
        const std::string what = std::string("share ") + share + " " + key;
        Tensor att = host_random(DType::kF32, {n, c.o_in}, rng);
        Tensor res = host_random(DType::kF32, {n, kHidden}, rng, -3.0f, 3.0f);
        if (special) {
          std::fill_n(att.ptr<float>(), att.numel(), 0.0f);
          std::fill_n(res.ptr<float>(), res.numel(), flat);
        }
        Tensor datt = be.to_device(att);
        Tensor x = be.to_device(res), ux = be.to_device(res);
        Tensor xn = be.alloc(DType::kF32, {n, kHidden}), logits = be.alloc(DType::kF32, {n, c.n_experts});
        Tensor idx = be.alloc(DType::kI32, {n, c.k}), wts = be.alloc(DType::kF32, {n, c.k});
        be.linear_residual_norm_router(dov, datt, x, dnorm, 1e-5f, drv, c.scoring, c.k, c.renorm, xn, logits, idx, wts);
        Tensor uxn = be.alloc(DType::kF32, {n, kHidden}), ulogits = be.alloc(DType::kF32, {n, c.n_experts});
        Tensor uidx = be.alloc(DType::kI32, {n, c.k}), uwts = be.alloc(DType::kF32, {n, c.k});
        be.linear_residual(dov, datt, ux);
        be.rms_norm_router(ux, dnorm, 1e-5f, drv, c.scoring, c.k, c.renorm, uxn, ulogits, uidx, uwts);
        const std::vector<float> xv = get(x), uxv = get(ux);  // bytes: the NaN case's values compare unequal
        EXPECT_EQ(0, std::memcmp(xv.data(), uxv.data(), xv.size() * 4)) << what << ": the residual differs";
        const bool fused = share[0] == '1' && c.shared && n <= 4;
        const std::vector<int32_t> ids = get_i(idx);
        if (special) {  // every logit ties (or is NaN: ranked after every number, by index): the lowest indices
          std::vector<int32_t> first(size_t(c.k));
          std::iota(first.begin(), first.end(), 0);
          EXPECT_EQ(ids, first) << what;
          if (std::isnan(flat)) {  // NaN values compare unequal: the indices are the check
            EXPECT_EQ(ids, get_i(uidx)) << what;
            continue;
          }
        }
        if (fused && !special) {
          EXPECT_LE(nmse(get(xn), get(uxn)), kElementwise) << what;
          EXPECT_LE(nmse(get(logits), get(ulogits)), kMatmul) << what;
          // The other order of rounding shows in some logit: proof that the share ran.
          EXPECT_NE(get(logits), get(ulogits)) << what << ": the logits are bit for bit the unshared ones";
        } else {
          EXPECT_EQ(get(xn), get(uxn)) << what;
          EXPECT_EQ(get(logits), get(ulogits)) << what;
        }
        EXPECT_EQ(get_i(idx), get_i(uidx)) << what;
        EXPECT_LE(nmse(get(wts), get(uwts)), kElementwise * 100) << what;
        // And against the CPU backend's ops.
        Tensor cx = cpu.alloc(DType::kF32, {n, kHidden});
        std::memcpy(cx.data, res.data, res.nbytes());
        Tensor cxn = cpu.alloc(DType::kF32, {n, kHidden}), clogits = cpu.alloc(DType::kF32, {n, c.n_experts});
        Tensor cidx = cpu.alloc(DType::kI32, {n, c.k}), cwts = cpu.alloc(DType::kF32, {n, c.k});
        cpu.linear_residual_norm_router(o, att, cx, norm, 1e-5f, r, c.scoring, c.k, c.renorm, cxn, clogits, cidx, cwts);
        EXPECT_LE(nmse(get(x), host_vec(cx)), kMatmul) << what;
        EXPECT_LE(nmse(get(xn), host_vec(cxn)), kMatmul) << what;
        EXPECT_LE(nmse(get(logits), host_vec(clogits)), kMatmul) << what;
        EXPECT_EQ(get_i(idx), host_i32_vec(cidx)) << what;
        EXPECT_LE(nmse(get(wts), host_vec(cwts)), kElementwise * 100) << what;
      }
    }
  }
}

// The router reduction with its inputs moved into shared memory by bulk copies (MOECEL_CUDA_ROUTER_BULK, the
// default) gives the bytes of its per-thread loads: the residual, xn, the logits, the indices and the weights; so does
// its variant specialized for OLMoE's exact shape (64 experts, hidden 2048; MOECEL_CUDA_ROUTER_EXACT=0 turns it off).
TEST_F(CudaOps, RouterReduceBulkCopiesMatchTheLoads) {
  struct Case {
    int64_t n_experts;
    int k;
    int64_t o_in, n;
  };
  Rng rng(108);
  for (const Case& c : {Case{kExperts, int(kTopK), kHidden, 1}, Case{32, 8, 4096, 1}, Case{kExperts, 4, kHidden, 4}}) {
    const LinearWeight o = make_quant(0, kHidden, c.o_in, 4, 64, DType::kBF16, rng);
    const LinearWeight r = make_quant(0, c.n_experts, kHidden, 4, 64, DType::kBF16, rng);
    const Tensor norm = host_random(DType::kBF16, {kHidden}, rng, 0.5f, 1.5f);
    const Tensor att = host_random(DType::kF32, {c.n, c.o_in}, rng);
    const Tensor res = host_random(DType::kF32, {c.n, kHidden}, rng, -3.0f, 3.0f);
    std::vector<float> vals[3];
    std::vector<int32_t> ids[3];
    for (int bulk = 0; bulk < 3; ++bulk) {  // loads, bulk copies, bulk copies without the exact-shape variant
      setenv("MOECEL_CUDA_ROUTER_BULK", bulk ? "1" : "0", 1);
      setenv("MOECEL_CUDA_ROUTER_EXACT", bulk == 2 ? "0" : "1", 1);
      CudaBackend be;
      unsetenv("MOECEL_CUDA_ROUTER_BULK");
      unsetenv("MOECEL_CUDA_ROUTER_EXACT");
      const LinearWeight dov = be.to_device(o), drv = be.to_device(r);
      const Tensor dnorm = be.to_device(norm), datt = be.to_device(att);
      Tensor x = be.to_device(res);
      Tensor xn = be.alloc(DType::kF32, {c.n, kHidden}), logits = be.alloc(DType::kF32, {c.n, c.n_experts});
      Tensor idx = be.alloc(DType::kI32, {c.n, c.k}), wts = be.alloc(DType::kF32, {c.n, c.k});
      be.linear_residual_norm_router(dov, datt, x, dnorm, 1e-5f, drv, RouterScoring::kSoftmax, c.k, false, xn, logits,
                                     idx, wts);
      for (const Tensor* t : {&x, &xn, &logits, &wts}) {
        const std::vector<float> v = dev_vec<float>(be, *t);
        vals[bulk].insert(vals[bulk].end(), v.begin(), v.end());
      }
      ids[bulk] = dev_vec<int32_t>(be, idx);
    }
    const std::string what =
        "experts " + std::to_string(c.n_experts) + " in " + std::to_string(c.o_in) + " n " + std::to_string(c.n);
    for (int v = 1; v < 3; ++v) {
      ASSERT_EQ(vals[0].size(), vals[v].size()) << what;
      EXPECT_EQ(0, std::memcmp(vals[0].data(), vals[v].data(), vals[0].size() * 4)) << what << " variant " << v;
      EXPECT_EQ(ids[0], ids[v]) << what << " variant " << v;
    }
  }
}

TEST_F(CudaOps, FusedMoeAddMatchesFusedMoeThenAdd) {
  Rng rng(104);
  for (int bits : {4, 8}) {
    const SwitchWeights hw{make_quant(kExperts, kFfn, kHidden, bits, 64, DType::kBF16, rng),
                           make_quant(kExperts, kFfn, kHidden, bits, 64, DType::kBF16, rng),
                           make_quant(kExperts, kHidden, kFfn, bits, 64, DType::kBF16, rng)};
    const SwitchWeights dw{cu().to_device(hw.gate), cu().to_device(hw.up), cu().to_device(hw.down)};
    Tensor x = cu().to_device(host_random(DType::kF32, {1, kHidden}, rng));
    Tensor idx = cu().to_device(host_i32({1, kTopK}, random_experts(1, kTopK, kExperts, rng)));
    Tensor wts = cu().to_device(host_random(DType::kF32, {1, kTopK}, rng, 0.0f, 0.3f));
    Tensor res = host_random(DType::kF32, {1, kHidden}, rng, -4.0f, 4.0f);
    Tensor acc = cu().alloc(DType::kF32, {1, kHidden});
    cu().from_host(res.data, acc);
    cu().fused_moe_add(dw.gate, dw.up, dw.down, Activation::kSiLU, x, idx, wts, acc);
    Tensor out = cu().alloc(DType::kF32, {1, kHidden}), sum = cu().alloc(DType::kF32, {1, kHidden});
    cu().fused_moe(dw.gate, dw.up, dw.down, Activation::kSiLU, x, idx, wts, out);
    cu().add(cu().to_device(res), out, sum);
    EXPECT_EQ(down(acc), down(sum)) << "bits " << bits;
    // The gather path through SwitchGLU::forward_add: the same sums to f32 rounding (kernel A multiplies on tensor
    // cores; test_fused_moe_cuda.cpp checks the bits with it on CUDA cores).
    const SwitchGLU glu(dw, Activation::kSiLU);
    Tensor gathered = cu().alloc(DType::kF32, {1, kHidden});
    cu().from_host(res.data, gathered);
    const Tensor moe = glu.forward_gather(cu(), x, idx, wts);
    cu().add(gathered, moe, gathered);
    EXPECT_LE(nmse(down(acc), down(gathered)), kMatmul) << "bits " << bits << ": fused + residual vs gather + add";
  }
}

// One token's o projection, router and fused experts as one op: the router ranked inside kernels A and B
// (MOECEL_CUDA_FUSED_ROUTE=1) against the two ops it replaces (=0, the default: bit for bit linear_residual_norm_router
// then fused_moe_add): the same experts, the weights and the residual to f32 rounding, over four calls in a row (each
// layer's kernel B zeroes the words the next one adds into), and the fallback on the float parts for a token of NaN or
// of values too large for the fixed point.
TEST_F(CudaOps, FusedRouteMatchesTheTwoOps) {
  struct Case {
    int64_t n_experts;
    int k;
    RouterScoring scoring;
    bool renorm;
    int bits;  // o projection, router and experts
    int r_group;
    DType stype;
  };
  setenv("MOECEL_CUDA_FUSED_ROUTE", "0", 1);
  CudaBackend off;
  setenv("MOECEL_CUDA_FUSED_ROUTE", "1", 1);
  CudaBackend on;
  unsetenv("MOECEL_CUDA_FUSED_ROUTE");
  Rng rng(109);
  for (const Case& c : {Case{kExperts, int(kTopK), RouterScoring::kSoftmax, false, 4, 64, DType::kBF16},  // olmoe
                        Case{32, 4, RouterScoring::kSoftmax, true, 8, 32, DType::kF16},
                        Case{16, 2, RouterScoring::kTopKSoftmax, false, 4, 64, DType::kF32}}) {
    const LinearWeight o = make_quant(0, kHidden, kHidden, c.bits, 64, c.stype, rng);
    const LinearWeight r = make_quant(0, c.n_experts, kHidden, c.bits, c.r_group, c.stype, rng);
    const SwitchWeights hw{make_quant(c.n_experts, kFfn, kHidden, c.bits, 64, c.stype, rng),
                           make_quant(c.n_experts, kFfn, kHidden, c.bits, 64, c.stype, rng),
                           make_quant(c.n_experts, kHidden, kFfn, c.bits, 64, c.stype, rng)};
    const Tensor norm = host_random(DType::kBF16, {kHidden}, rng, 0.5f, 1.5f);
    struct Dev {
      LinearWeight o, r, gate, up, down;
      Tensor norm, x;
    };
    auto upload = [&](CudaBackend& be) {
      return Dev{be.to_device(o),    be.to_device(r), be.to_device(hw.gate), be.to_device(hw.up), be.to_device(hw.down),
                 be.to_device(norm), Tensor{}};
    };
    Dev don = upload(on), doff = upload(off);
    const Tensor res0 = host_random(DType::kF32, {1, kHidden}, rng, -3.0f, 3.0f);
    don.x = on.to_device(res0);
    doff.x = off.to_device(res0);
    Tensor ux = off.to_device(res0);        // the ops one by one
    for (int call = 0; call < 6; ++call) {  // calls 4 and 5: a residual of NaN, then of values near 1e9
      const std::string what = "experts " + std::to_string(c.n_experts) + " k " + std::to_string(c.k) + " bits " +
                               std::to_string(c.bits) + " call " + std::to_string(call);
      const Tensor att = host_random(DType::kF32, {1, kHidden}, rng);
      if (call >= 4) {
        Tensor special = host_random(DType::kF32, {1, kHidden}, rng, 0.5e9f, 1e9f);
        if (call == 4) std::fill_n(special.ptr<float>(), special.numel(), NAN);
        for (CudaBackend* be : {&on, &off}) be->from_host(special.data, be == &on ? don.x : doff.x);
        off.from_host(special.data, ux);
      }
      Tensor idx_on = on.alloc(DType::kI32, {1, c.k}), w_on = on.alloc(DType::kF32, {1, c.k});
      Tensor idx_off = off.alloc(DType::kI32, {1, c.k}), w_off = off.alloc(DType::kF32, {1, c.k});
      const Activation act = Activation::kSiLU;
      on.linear_residual_router_fused_moe_add(don.o, on.to_device(att), don.x, don.norm, 1e-5f, don.r, c.scoring, c.k,
                                              c.renorm, don.gate, don.up, don.down, act, idx_on, w_on);
      off.linear_residual_router_fused_moe_add(doff.o, off.to_device(att), doff.x, doff.norm, 1e-5f, doff.r, c.scoring,
                                               c.k, c.renorm, doff.gate, doff.up, doff.down, act, idx_off, w_off);
      Tensor xn = off.alloc(DType::kF32, {1, kHidden}), logits = off.alloc(DType::kF32, {1, c.n_experts});
      Tensor uidx = off.alloc(DType::kI32, {1, c.k}), uw = off.alloc(DType::kF32, {1, c.k});
      off.linear_residual_norm_router(doff.o, off.to_device(att), ux, doff.norm, 1e-5f, doff.r, c.scoring, c.k,
                                      c.renorm, xn, logits, uidx, uw);
      off.fused_moe_add(doff.gate, doff.up, doff.down, act, xn, uidx, uw, ux);
      const std::vector<float> x_on = dev_vec<float>(on, don.x), x_off = dev_vec<float>(off, doff.x);
      const std::vector<float> x_ops = dev_vec<float>(off, ux);
      EXPECT_EQ(0, std::memcmp(x_off.data(), x_ops.data(), x_ops.size() * 4)) << what << ": route off vs the ops";
      EXPECT_EQ(dev_vec<int32_t>(off, idx_off), dev_vec<int32_t>(off, uidx)) << what;
      EXPECT_EQ(dev_vec<int32_t>(on, idx_on), dev_vec<int32_t>(off, uidx)) << what << ": the experts";
      if (call == 4) {  // NaN: ranked by index, every output NaN
        std::vector<int32_t> first(size_t(c.k));
        std::iota(first.begin(), first.end(), 0);
        EXPECT_EQ(dev_vec<int32_t>(on, idx_on), first) << what;
        for (float v : x_on) ASSERT_TRUE(std::isnan(v)) << what;
      } else {
        EXPECT_LE(nmse(dev_vec<float>(on, w_on), dev_vec<float>(off, uw)), kElementwise * 100) << what;
        EXPECT_LE(nmse(x_on, x_ops), kMatmul) << what;
        // Kernel A's norm adds the squares in another order: some bit differs, proof that the route ran.
        if (call < 4) {
          EXPECT_NE(x_on, x_ops) << what << ": the route's residual is bit for bit the two ops'";
        }
      }
      // Both go on from the same residual (the NaN call excepted: each its own).
      on.from_host(x_ops.data(), don.x);
    }
  }
}

// The attention block of full-width q/k norms in one launch (MOECEL_CUDA_FUSIONS bit 16, on by default) against the
// two launches it replaces (bit 16 off) bit for bit, and against the CPU: GQA, head sizes 64 to 256, partial
// rotary, a sliding window, positions from 0 to near the end of the cache. Cache rows requested into L2 before the
// wait (MOECEL_CUDA_KV_PREFETCH) change no bit: the two launches with 256 rows, the one launch with none and with
// the default.
TEST_F(CudaOps, QkNormRopeAttentionMatchesTheTwoOps) {
  struct Case {
    int n_heads, n_kv_heads, head_dim, rot_dims, window;
  };
  Rng rng(29);
  const int64_t max_pos = 200;
  for (const Case& c : {Case{16, 16, 128, 128, 0}, Case{8, 2, 64, 32, 0}, Case{4, 4, 96, 96, 5},
                        Case{4, 1, 256, 256, 0}, Case{2, 2, 40, 40, 0}}) {
    const int64_t qw = int64_t(c.n_heads) * c.head_dim, kw = int64_t(c.n_kv_heads) * c.head_dim;
    Tensor qn = host_random(DType::kBF16, {qw}, rng, 0.5f, 1.5f), kn = host_random(DType::kF32, {kw}, rng, 0.5f, 1.5f);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    for (int64_t pos0 : {int64_t(0), int64_t(7), max_pos - 1}) {
      Tensor q = host_random(DType::kF32, {1, qw}, rng, -3.0f, 3.0f), k = host_random(DType::kF32, {1, kw}, rng);
      Tensor v = host_random(DType::kF32, {1, kw}, rng);
      Tensor kc = host_random(DType::kF32, {max_pos, kw}, rng), vc = host_random(DType::kF32, {max_pos, kw}, rng);
      const std::string what = "heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " dim " +
                               std::to_string(c.head_dim) + " window " + std::to_string(c.window) + " pos0 " +
                               std::to_string(pos0);
      std::vector<float> outs[3], kcs[3], vcs[3];
      for (int pass = 0; pass < 3; ++pass) {
        const int fused = pass > 0;
        setenv("MOECEL_CUDA_FUSIONS", fused ? "23" : "7", 1);
        if (pass < 2) setenv("MOECEL_CUDA_KV_PREFETCH", pass == 0 ? "256" : "0", 1);
        CudaBackend be;
        unsetenv("MOECEL_CUDA_FUSIONS");
        unsetenv("MOECEL_CUDA_KV_PREFETCH");
        Tensor dq = be.to_device(q), dk = be.to_device(k), dv = be.to_device(v), dqn = be.to_device(qn),
               dkn = be.to_device(kn), dkc = be.to_device(kc), dvc = be.to_device(vc);
        Tensor out = be.scratch(DType::kF32, {1, qw});
        be.qk_norm_rope_attention(dq, dk, dv, dqn, dkn, 1e-5f, c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dims,
                                  10000.0f, dkc, dvc, pos0, scale, c.window, out);
        auto get = [&](const Tensor& t) {
          std::vector<float> h(static_cast<size_t>(t.numel()));
          be.to_host(t, h.data());
          return h;
        };
        outs[pass] = get(out);
        kcs[pass] = get(dkc);
        vcs[pass] = get(dvc);
      }
      for (int pass = 1; pass < 3; ++pass) {
        EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[pass].data(), outs[0].size() * 4)) << what << " pass " << pass;
        EXPECT_EQ(0, std::memcmp(kcs[0].data(), kcs[pass].data(), kcs[0].size() * 4)) << what << " pass " << pass;
        EXPECT_EQ(0, std::memcmp(vcs[0].data(), vcs[pass].data(), vcs[0].size() * 4)) << what << " pass " << pass;
      }
      Tensor ref = cpu.alloc(DType::kF32, {1, qw});
      cpu.qk_norm_rope_attention(q, k, v, qn, kn, 1e-5f, c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dims, 10000.0f, kc,
                                 vc, pos0, scale, c.window, ref);
      EXPECT_LE(nmse(outs[1], down(ref)), kAttention) << what;
      EXPECT_LE(nmse(kcs[1], down(kc)), kElementwise) << what;
    }
  }
}

TEST_F(CudaOps, ArgmaxManyBlocksAndRows) {
  Rng rng(105);
  for (int64_t vocab : {int64_t(1), int64_t(5), int64_t(1025), int64_t(151936), int64_t(300000)}) {
    for (int64_t n : {1, 3}) {
      Tensor logits = host_random(DType::kF32, {n, vocab}, rng, -10.0f, 10.0f);
      if (vocab > 2) {
        for (int64_t t = 0; t < n; ++t) {  // a planted tie far apart (different blocks): the lower index wins
          const int64_t a = rng.below(vocab / 2), b = vocab - 1 - rng.below(vocab / 4);
          logits.ptr<float>()[t * vocab + a] = 20.0f;
          logits.ptr<float>()[t * vocab + b] = 20.0f;
        }
      }
      const Tensor d = cu().to_device(logits);
      const std::vector<int32_t> want = cpu.argmax(logits);
      EXPECT_EQ(cu().argmax(d), want) << "vocab " << vocab << " n " << n;
      Tensor ids = cu().alloc(DType::kI32, {n});
      cu().argmax_to(d, ids);
      EXPECT_EQ(down<int32_t>(ids), want) << "argmax_to, vocab " << vocab << " n " << n;
    }
  }
}

}  // namespace
}  // namespace moecel::ops_test
