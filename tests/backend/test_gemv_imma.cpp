// One token of rms_norm_linears (q, k and v of a decode step) through the int8 tensor-core kernel
// (gemv_bulk_imma.cu, MOECEL_CUDA_GEMV_IMMA = 1 or 2 tiles per block) against the CPU backend and the CUDA-core
// bulk kernel it replaces (= 0).
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
}

}  // namespace
}  // namespace moecel::ops_test
