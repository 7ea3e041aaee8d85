// One token of rms_norm_linears (q, k and v of a decode step) through the int8 tensor-core kernel
// (gemv_bulk_imma.cu, MOECEL_CUDA_GEMV_IMMA = 1 or 2 tiles per block) against the CPU backend and the CUDA-core
// bulk kernel it replaces (= 0); and one token of the output projection's form (linear_residual and
// linear_residual_norm_router, MOECEL_CUDA_GEMV_RESIDUAL_IMMA = 1) against the CPU and the CUDA-core kernel (= 0).
#include "backend_ops_common.h"

namespace moecel::ops_test {
namespace {

struct ImmaCase {
  int bits, group_size;
  DType scale_type;
  std::vector<int64_t> outs;
  int64_t in;
  bool imma;  // the int8 kernel takes it (4/8 bits, whole 16-row tiles)
};

struct ImmaRun {
  std::vector<std::vector<float>> ys;
};

ImmaRun run_linears(const char* imma, const ImmaCase& c, const std::vector<LinearWeight>& host_w, const Tensor& norm,
                    const Tensor& x) {
  setenv("MOECEL_CUDA_GEMV_IMMA", imma, 1);
  CudaBackend be;
  unsetenv("MOECEL_CUDA_GEMV_IMMA");
  std::vector<LinearWeight> dev_w;
  for (const LinearWeight& w : host_w) dev_w.push_back(be.to_device(w));
  const Tensor dnorm = be.to_device(norm), dx = be.to_device(x);
  std::vector<Tensor> ys;
  std::vector<Tensor*> y_ptrs;
  std::vector<const LinearWeight*> w_ptrs;
  for (int64_t out : c.outs) ys.push_back(be.alloc(DType::kF32, {1, out}));
  for (size_t i = 0; i < ys.size(); ++i) {
    y_ptrs.push_back(&ys[i]);
    w_ptrs.push_back(&dev_w[i]);
  }
  ImmaRun r;
  be.rms_norm_linears(dx, dnorm, 1e-5f, w_ptrs, y_ptrs, nullptr);  // no xn: the decoder's q/k/v call
  for (const Tensor& y : ys) r.ys.push_back(dev_vec<float>(be, y));
  return r;
}

TEST_F(CudaOps, RmsNormLinearsImmaKernelMatchesCpu) {
  Rng rng(211);
  const std::vector<ImmaCase> cases = {
      {4, 64, DType::kF16, {kHidden, kHidden, kHidden}, kHidden, true},  // OLMoE q, k, v
      {4, 64, DType::kBF16, {4096, 512, 512}, kHidden, true},            // Qwen3-30B-A3B's GQA widths
      {8, 32, DType::kBF16, {32, 64}, 512, true},
      {4, 128, DType::kF32, {48}, 4096, true},  // more octets than threads
      {8, 128, DType::kF16, {32}, 1024, true},
      {4, 64, DType::kF16, {24, 40}, 512, false},  // not whole 16-row tiles
      {6, 64, DType::kBF16, {64}, 512, false},     // 6 bits
  };
  for (const ImmaCase& c : cases) {
    std::vector<LinearWeight> host_w;
    for (int64_t out : c.outs) host_w.push_back(make_quant(0, out, c.in, c.bits, c.group_size, c.scale_type, rng));
    const Tensor norm = host_random(DType::kBF16, {c.in}, rng, 0.5f, 1.5f);
    // One value far from the rest: each group gets its own fixed-point exponent.
    Tensor x = host_random(DType::kF32, {1, c.in}, rng, -3.0f, 3.0f);
    store_float(x, 5, 900.0f);
    Tensor cxn = cpu.alloc(DType::kF32, {1, c.in});
    cpu.rms_norm(x, norm, 1e-5f, cxn);
    const std::string what = "bits " + std::to_string(c.bits) + " gs " + std::to_string(c.group_size) + " in " +
                             std::to_string(c.in) + " out0 " + std::to_string(c.outs[0]);
    const ImmaRun plain = run_linears("0", c, host_w, norm, x);
    const ImmaRun one = run_linears("1", c, host_w, norm, x);
    const ImmaRun again = run_linears("1", c, host_w, norm, x);
    const ImmaRun two = run_linears("2", c, host_w, norm, x);
    for (size_t i = 0; i < c.outs.size(); ++i) {
      Tensor ref = cpu.alloc(DType::kF32, {1, c.outs[i]});
      cpu.linear(host_w[i], cxn, ref);
      const std::string part = what + " part " + std::to_string(i);
      ASSERT_EQ(one.ys[i].size(), size_t(c.outs[i])) << part;
      EXPECT_LE(nmse(plain.ys[i], host_vec(ref)), kMatmul) << "CUDA cores, " << part;
      EXPECT_LE(nmse(one.ys[i], host_vec(ref)), kMatmul) << "int8, " << part;
      EXPECT_EQ(one.ys[i], again.ys[i]) << "rerun, " << part;
      // Two tiles per block take only parts of whole 32-row blocks; the others fall back to the CUDA-core sums.
      const bool whole32 = std::all_of(c.outs.begin(), c.outs.end(), [](int64_t o) { return o % 32 == 0; });
      EXPECT_EQ(two.ys[i], whole32 ? one.ys[i] : plain.ys[i]) << "two tiles per block, " << part;
      for (float v : one.ys[i]) ASSERT_TRUE(std::isfinite(v)) << part;
      if (c.imma) {
        EXPECT_NE(one.ys[i], plain.ys[i]) << part << ": bit for bit the CUDA-core sums (the int8 kernel did not run)";
      } else {
        EXPECT_EQ(one.ys[i], plain.ys[i]) << part << ": no int8 kernel for this shape";
      }
    }
  }
}

TEST_F(CudaOps, GemvImmaKnobRejectsUnknownValue) {
  setenv("MOECEL_CUDA_GEMV_IMMA", "3", 1);
  EXPECT_THROW({ CudaBackend be; }, Error);
  unsetenv("MOECEL_CUDA_GEMV_IMMA");
  setenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA", "2", 1);
  EXPECT_THROW({ CudaBackend be; }, Error);
  unsetenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA");
}

struct ResidualCase {
  int bits, group_size;
  DType scale_type;
  int64_t out, in;
  bool imma;  // the int8 kernel takes it
};

// y = residual + x @ w^T for one token, with MOECEL_CUDA_GEMV_RESIDUAL_IMMA = knob.
std::vector<float> run_residual(const char* knob, const LinearWeight& w, const Tensor& x, const Tensor& res) {
  setenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA", knob, 1);
  CudaBackend be;
  unsetenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA");
  const LinearWeight dw = be.to_device(w);
  const Tensor dx = be.to_device(x);
  Tensor y = be.to_device(res);
  be.linear_residual(dw, dx, y);
  return dev_vec<float>(be, y);
}

TEST_F(CudaOps, LinearResidualImmaKernelMatchesCpu) {
  Rng rng(223);
  const std::vector<ResidualCase> cases = {
      {4, 64, DType::kF16, kHidden, kHidden, true},  // OLMoE's o
      {8, 32, DType::kBF16, 512, 1024, true},       {4, 128, DType::kF32, 64, 2048, true},
      {8, 128, DType::kF16, 32, 1024, true},        {4, 64, DType::kBF16, kHidden, 4096, true},  // Qwen3-30B-A3B's o
      {4, 64, DType::kF16, 40, 512, false},   // not whole 16-row tiles
      {4, 64, DType::kF16, 64, 256, false},   // 4 groups do not split over 8 warps
      {6, 64, DType::kBF16, 64, 512, false},  // 6 bits
  };
  for (const ResidualCase& c : cases) {
    const LinearWeight w = make_quant(0, c.out, c.in, c.bits, c.group_size, c.scale_type, rng);
    Tensor x = host_random(DType::kF32, {1, c.in}, rng, -3.0f, 3.0f);
    store_float(x, 5, 900.0f);  // each group gets its own fixed-point exponent
    const Tensor res = host_random(DType::kF32, {1, c.out}, rng, -4.0f, 4.0f);
    Tensor ref = cpu.alloc(DType::kF32, {1, c.out});
    cpu.linear(w, x, ref);
    cpu.add(res, ref, ref);
    const std::string what = "bits " + std::to_string(c.bits) + " gs " + std::to_string(c.group_size) + " in " +
                             std::to_string(c.in) + " out " + std::to_string(c.out);
    const std::vector<float> plain = run_residual("0", w, x, res), one = run_residual("1", w, x, res);
    ASSERT_EQ(one.size(), size_t(c.out)) << what;
    EXPECT_LE(nmse(plain, host_vec(ref)), kMatmul) << "CUDA cores, " << what;
    EXPECT_LE(nmse(one, host_vec(ref)), kMatmul) << "int8, " << what;
    EXPECT_EQ(one, run_residual("1", w, x, res)) << "rerun, " << what;
    for (float v : one) ASSERT_TRUE(std::isfinite(v)) << what;
    if (c.imma) {
      EXPECT_NE(one, plain) << what << ": bit for bit the CUDA-core sums (the int8 kernel did not run)";
    } else {
      EXPECT_EQ(one, plain) << what << ": no int8 kernel for this shape";
    }
  }
}

// The o projection with the router's share, one token, on the int8 kernel: OLMoE's shapes (parts of 16 rows) and a
// 4096-wide attention (parts of 8 rows, two per block). The residual bit for bit linear_residual's with the same knob
// and not the CUDA-core kernel's; the residual, xn, logits, experts and weights against the CPU with either knob.
TEST_F(CudaOps, LinearResidualNormRouterImmaMatchesCpu) {
  struct Case {
    int64_t o_in, n_experts;
  };
  Rng rng(227);
  for (const Case& c : {Case{kHidden, kExperts}, Case{4096, 32}}) {
    const LinearWeight o = make_quant(0, kHidden, c.o_in, 4, 64, DType::kBF16, rng);
    const LinearWeight r = make_quant(0, c.n_experts, kHidden, 4, 64, DType::kBF16, rng);
    const Tensor norm = host_random(DType::kBF16, {kHidden}, rng, 0.5f, 1.5f);
    Tensor att = host_random(DType::kF32, {1, c.o_in}, rng, -3.0f, 3.0f);
    store_float(att, 77, -500.0f);
    const Tensor res = host_random(DType::kF32, {1, kHidden}, rng, -3.0f, 3.0f);
    const int k = int(kTopK);
    Tensor cx = cpu.alloc(DType::kF32, {1, kHidden});
    std::memcpy(cx.data, res.data, res.nbytes());
    Tensor cxn = cpu.alloc(DType::kF32, {1, kHidden}), clogits = cpu.alloc(DType::kF32, {1, c.n_experts});
    Tensor cidx = cpu.alloc(DType::kI32, {1, k}), cwts = cpu.alloc(DType::kF32, {1, k});
    cpu.linear_residual_norm_router(o, att, cx, norm, 1e-5f, r, RouterScoring::kSoftmax, k, false, cxn, clogits, cidx,
                                    cwts);
    std::vector<float> ys[2], ls[2];
    for (int knob = 0; knob < 2; ++knob) {
      setenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA", knob ? "1" : "0", 1);
      CudaBackend be;
      unsetenv("MOECEL_CUDA_GEMV_RESIDUAL_IMMA");
      auto get = [&](const Tensor& t) { return dev_vec<float>(be, t); };
      const LinearWeight dov = be.to_device(o), drv = be.to_device(r);
      const Tensor dnorm = be.to_device(norm), datt = be.to_device(att);
      Tensor x = be.to_device(res), lx = be.to_device(res);
      Tensor xn = be.alloc(DType::kF32, {1, kHidden}), logits = be.alloc(DType::kF32, {1, c.n_experts});
      Tensor idx = be.alloc(DType::kI32, {1, k}), wts = be.alloc(DType::kF32, {1, k});
      be.linear_residual_norm_router(dov, datt, x, dnorm, 1e-5f, drv, RouterScoring::kSoftmax, k, false, xn, logits,
                                     idx, wts);
      be.linear_residual(dov, datt, lx);
      const std::string what = "o in " + std::to_string(c.o_in) + " knob " + std::to_string(knob);
      ys[knob] = get(x);
      ls[knob] = get(logits);
      EXPECT_EQ(ys[knob], get(lx)) << what << ": the share's residual is not linear_residual's";
      EXPECT_LE(nmse(ys[knob], host_vec(cx)), kMatmul) << what;
      EXPECT_LE(nmse(get(xn), host_vec(cxn)), kMatmul) << what;
      EXPECT_LE(nmse(ls[knob], host_vec(clogits)), kMatmul) << what;
      EXPECT_EQ(dev_vec<int32_t>(be, idx), host_i32_vec(cidx)) << what;
      EXPECT_LE(nmse(get(wts), host_vec(cwts)), kElementwise * 100) << what;
    }
    EXPECT_NE(ys[1], ys[0]) << "o in " << c.o_in << ": bit for bit the CUDA-core sums (the int8 kernel did not run)";
    EXPECT_NE(ls[1], ls[0]) << "o in " << c.o_in << ": the logits are bit for bit the CUDA-core kernel's";
  }
}

}  // namespace
}  // namespace moecel::ops_test
