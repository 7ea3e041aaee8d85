// CUDA-vs-CPU and CUDA-vs-f64 tests of the tensor-core tiled product (qgemm_mma.cu): prefill shapes of
// OLMoE-1B-7B, every precision mode (MOECEL_CUDA_MMA), fallbacks, and the small shapes of the golden models.
#include "backend_ops_common.h"

namespace moecel {
namespace {

using namespace ops_test;  // NOLINT: the shared fixture, helpers and thresholds

constexpr double kMatmulBf16X = 2e-5;  // MOECEL_CUDA_MMA=fast rounds x to bf16: ~3e-6 expected

// Sets MOECEL_CUDA_MMA for one scope (launch_gemm reads it on every call) and restores the previous value.
class MmaMode {
 public:
  explicit MmaMode(const char* value) {
    const char* old = std::getenv("MOECEL_CUDA_MMA");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      setenv("MOECEL_CUDA_MMA", value, 1);
    } else {
      unsetenv("MOECEL_CUDA_MMA");
    }
  }
  ~MmaMode() {
    if (had_) {
      setenv("MOECEL_CUDA_MMA", old_.c_str(), 1);
    } else {
      unsetenv("MOECEL_CUDA_MMA");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

// The three kernels launch_gemm can run, each with the error it must stay under against the f32 CPU oracle.
struct GemmMode {
  const char* env;
  const char* name;
  double tol;
};
constexpr GemmMode kGemmModes[] = {
    {nullptr, "tensor cores, split x (default)", kMatmul},
    {"fast", "tensor cores, bf16 x", kMatmulBf16X},
    {"0", "CUDA cores", kMatmul},
};

// One CPU reference, then linear in every mode. x values in [-amp, amp].
void check_linear_modes(CudaOps& f, CudaBackend& cu, const LinearWeight& w, int64_t n, Rng& rng,
                        const std::string& what, float amp = 1.0f) {
  const LinearWeight dw = cu.to_device(w);
  Tensor x = host_random(DType::kF32, {n, w.in}, rng, -amp, amp);
  Tensor ref = f.cpu.alloc(DType::kF32, {n, w.out});
  f.cpu.linear(w, x, ref);
  const std::vector<float> r = f.down(ref);
  const Tensor dx = cu.to_device(x);
  for (const GemmMode& m : kGemmModes) {
    MmaMode mode(m.env);
    Tensor got = cu.alloc(DType::kF32, {n, w.out});
    cu.linear(dw, dx, got);
    EXPECT_LE(nmse(f.down(got), r), m.tol)
        << what << " [" << m.name << "] out " << w.out << " in " << w.in << " n_tokens " << n;
  }
}

void check_gather_modes(CudaOps& f, CudaBackend& cu, const LinearWeight& w, int64_t k, bool per_slot, int64_t n,
                        Rng& rng, const std::string& what) {
  const LinearWeight dw = cu.to_device(w);
  Tensor x = per_slot ? host_random(DType::kF32, {n, k, w.in}, rng) : host_random(DType::kF32, {n, w.in}, rng);
  Tensor idx = host_i32({n, k}, random_experts(n, k, w.n_stack, rng));
  Tensor ref = f.cpu.alloc(DType::kF32, {n, k, w.out});
  f.cpu.gather_linear(w, x, idx, ref);
  const std::vector<float> r = f.down(ref);
  const Tensor dx = cu.to_device(x), didx = cu.to_device(idx);
  for (const GemmMode& m : kGemmModes) {
    MmaMode mode(m.env);
    Tensor got = cu.alloc(DType::kF32, {n, k, w.out});
    cu.gather_linear(dw, dx, didx, got);
    EXPECT_LE(nmse(f.down(got), r), m.tol)
        << what << " [" << m.name << "]" << (per_slot ? " per-slot x" : " shared x") << " experts " << w.n_stack
        << " out " << w.out << " in " << w.in << " k " << k << " n_tokens " << n;
  }
}

TEST_F(CudaOps, MmaPrefillLinearOlmoeShapes) {
  Rng rng(101);
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      const std::string what = "bits " + std::to_string(bits) + " group " + std::to_string(gs);
      const int64_t n = gs == 64 ? 512 : 130;  // pp512 on the checkpoint's own format; a partial tile elsewhere
      check_linear_modes(*this, cu(), make_quant(0, kHidden, kHidden, bits, gs, DType::kBF16, rng), n, rng,
                         what + " q_proj");
      check_linear_modes(*this, cu(), make_quant(0, kExperts, kHidden, bits, gs, DType::kF16, rng), n, rng,
                         what + " router");
    }
  }
}

TEST_F(CudaOps, MmaPrefillGatherOlmoeShapes) {
  Rng rng(102);
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      const std::string what = "bits " + std::to_string(bits) + " group " + std::to_string(gs);
      const int64_t n = gs == 64 ? 512 : 100;
      check_gather_modes(*this, cu(), make_quant(kExperts, kFfn, kHidden, bits, gs, DType::kBF16, rng), kTopK, false, n,
                         rng, what + " gate_proj");
      check_gather_modes(*this, cu(), make_quant(kExperts, kHidden, kFfn, bits, gs, DType::kF16, rng), kTopK, true, n,
                         rng, what + " down_proj");
    }
  }
}

TEST_F(CudaOps, MmaOddShapes) {
  Rng rng(103);
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
        const std::string what =
            "bits " + std::to_string(bits) + " group " + std::to_string(gs) + " scales " + dtype_str(sd);
        // Rows below, at and past one 128-row block; one to five groups; tiles of 5 .. 129 tokens. (Plain products of
        // up to 256 rows take the matrix-vector kernel, linear_prefers_gemv; the gather calls below keep partial
        // row blocks on the tiled kernels.)
        for (int64_t out : {int64_t(1), int64_t(13), int64_t(128), int64_t(257)}) {
          const int64_t in = gs * (1 + rng.below(5));
          check_linear_modes(*this, cu(), make_quant(0, out, in, bits, gs, sd, rng), 5 + rng.below(125), rng, what);
        }
        check_gather_modes(*this, cu(), make_quant(5, 70, 3 * gs, bits, gs, sd, rng), 3, true, 33, rng, what);
        check_gather_modes(*this, cu(), make_quant(3, 200, gs, bits, gs, sd, rng), 2, false, 150, rng, what);
      }
    }
  }
}

TEST_F(CudaOps, MmaDenseBf16) {
  Rng rng(104);
  check_linear_modes(*this, cu(), make_dense(0, kHidden, kHidden, DType::kBF16, rng), 512, rng, "dense bf16");
  // in % 32 != 0 (a zero-filled last slice), in % 8 != 0 (the CUDA-core fallback), and F16 (always the fallback).
  check_linear_modes(*this, cu(), make_dense(0, 13, 40, DType::kBF16, rng), 70, rng, "dense bf16 in 40");
  check_linear_modes(*this, cu(), make_dense(0, 130, 72, DType::kBF16, rng), 9, rng, "dense bf16 in 72");
  check_linear_modes(*this, cu(), make_dense(0, 13, 37, DType::kBF16, rng), 70, rng, "dense bf16 in 37");
  check_linear_modes(*this, cu(), make_dense(0, 64, 256, DType::kF16, rng), 70, rng, "dense f16");
  check_gather_modes(*this, cu(), make_dense(6, 130, 72, DType::kBF16, rng), 2, false, 64, rng, "dense bf16");
  check_gather_modes(*this, cu(), make_dense(6, 33, 1024, DType::kBF16, rng), 2, true, 70, rng, "dense bf16");
}

TEST_F(CudaOps, MmaLargeActivations) {
  Rng rng(105);
  // |x| up to 3e5: far past f16's 65504 (the f16 split scales each row of x by a power of two first), and |x|
  // ~1e-25, where f16 would keep nothing of an unscaled x.
  check_linear_modes(*this, cu(), make_quant(0, 256, kHidden, 4, 64, DType::kBF16, rng), 64, rng, "4-bit", 3e5f);
  check_linear_modes(*this, cu(), make_quant(0, 256, kHidden, 8, 32, DType::kF16, rng), 64, rng, "8-bit", 3e5f);
  check_linear_modes(*this, cu(), make_dense(0, 256, 512, DType::kBF16, rng), 64, rng, "dense bf16", 3e5f);
  check_linear_modes(*this, cu(), make_quant(0, 256, kHidden, 4, 64, DType::kBF16, rng), 64, rng, "4-bit", 1e-25f);
  check_linear_modes(*this, cu(), make_quant(0, 256, kHidden, 8, 32, DType::kF16, rng), 64, rng, "8-bit", 1e-25f);
}

TEST_F(CudaOps, MmaRowsOfDifferentMagnitudes) {
  Rng rng(108);
  // Rows of one tile from 1e-30 to 1e30 (each row's own scale), a zero row, and a row with one large value among
  // small ones: every row must be as exact as alone, measured per row.
  const LinearWeight w = make_quant(0, 256, 512, 4, 64, DType::kF16, rng);
  const LinearWeight dw = cu().to_device(w);
  const int64_t n = 70;
  Tensor x = host_random(DType::kF32, {n, w.in}, rng);
  float* xv = static_cast<float*>(x.data);
  for (int64_t t = 0; t < n; ++t) {
    const float mag = std::pow(10.0f, float(t % 13) * 5.0f - 30.0f);
    for (int64_t i = 0; i < w.in; ++i) xv[t * w.in + i] *= t == 5 ? 0.0f : mag;
  }
  xv[7 * w.in + 3] = 1e6f;  // row 7 (magnitude 1e5): one value 10x the rest
  Tensor ref = cpu.alloc(DType::kF32, {n, w.out});
  cpu.linear(w, x, ref);
  Tensor got = cu().alloc(DType::kF32, {n, w.out});
  cu().linear(dw, cu().to_device(x), got);
  const std::vector<float> r = down(ref), g = down(got);
  for (int64_t t = 0; t < n; ++t) {
    // The row divided by the reference row's largest magnitude (nmse's floor would hide an error on tiny rows).
    float peak = 0.0f;
    for (int64_t o = 0; o < w.out; ++o) peak = std::max(peak, std::fabs(r[size_t(t * w.out + o)]));
    const auto row = [&](const std::vector<float>& v) {
      std::vector<float> out(v.begin() + t * w.out, v.begin() + (t + 1) * w.out);
      if (t != 5) {
        for (float& e : out) e = float(double(e) / double(peak));
      }
      return out;
    };
    if (t == 5) {
      for (float v : row(g)) ASSERT_EQ(v, 0.0f) << "zero row";
    } else {
      EXPECT_LE(nmse(row(g), row(r)), kMatmul) << "row " << t;
    }
  }
}

TEST_F(CudaOps, MmaUnalignedInputFallsBack) {
  Rng rng(106);
  const LinearWeight w = make_quant(0, 96, 256, 4, 64, DType::kF16, rng);
  const LinearWeight dw = cu().to_device(w);
  const int64_t n = 70;
  Tensor x = host_random(DType::kF32, {n, w.in}, rng);
  Tensor ref = cpu.alloc(DType::kF32, {n, w.out});
  cpu.linear(w, x, ref);
  // x one float into a device buffer: not 16-byte aligned, so launch_gemm must take the CUDA-core kernel.
  Tensor buf = cu().alloc(DType::kF32, {n * w.in + 1});
  Tensor dx{DType::kF32, {n, w.in}, buf.ptr<float>() + 1, Device::kCuda, buf.owner};
  std::vector<float> hx(static_cast<size_t>(n * w.in));
  std::memcpy(hx.data(), x.data, x.nbytes());
  cu().from_host(hx.data(), dx);
  Tensor got = cu().alloc(DType::kF32, {n, w.out});
  cu().linear(dw, dx, got);
  EXPECT_LE(nmse(down(got), down(ref)), kMatmul);
}

TEST_F(CudaOps, MmaModeRejectsUnknownValue) {
  Rng rng(107);
  // More rows than the matrix-vector kernel takes at any token count (linear_prefers_gemv).
  const LinearWeight dw = cu().to_device(make_quant(0, 512, 64, 4, 32, DType::kF16, rng));
  MmaMode mode("yes");
  Tensor got = cu().alloc(DType::kF32, {64, 512});
  EXPECT_THROW(cu().linear(dw, cu().to_device(host_random(DType::kF32, {64, 64}, rng)), got), Error);
}

// ---- golden-model shapes (hidden 64-256, groups 32-128, ~20 tokens, 0-5 pairs per expert) against f64 ----
// 5 to 20 tokens: up to kGemvMaxTokens (4) the matrix-vector kernels run instead of launch_gemm.

// Split x must be as exact as f32 dots: at most ~3e-13 here against f64 (the truncating f32 accumulation only). x
// as two bf16 terms with raw codes gave 1e-11 .. 9e-11 on these inputs (~5e-12 dense), which the tiny golden models
// amplified to 1e-4 .. 3e-4 relative L2 in their logits; the CUDA-core kernel gives ~1e-13.
constexpr double kMatmulSmall = 2e-12;

constexpr GemmMode kSmallModes[] = {
    {nullptr, "tensor cores, split x (default)", kMatmulSmall},
    {"fast", "tensor cores, bf16 x", kMatmulBf16X},
    {"0", "CUDA cores", kMatmulSmall},
};

// A weight with the exact values the kernels must multiply, for an f64 reference: w(e, r, k) = value(e, r, k).
struct RefWeight {
  LinearWeight w;
  std::vector<uint8_t> q;  // quantized: (experts, out, in) codes
  std::vector<double> s;   // quantized: (experts, out, groups) stored scales as f32; dense: (experts, out, in) values
  std::vector<double> b;   // quantized: (experts, out, groups) stored biases as f32

  double value(int64_t e, int64_t r, int64_t k) const {
    const int64_t row = e * w.out + r;
    if (w.bits == 0) return s[size_t(row * w.in + k)];
    const int64_t g = row * (w.in / w.group_size) + k / w.group_size;
    return s[size_t(g)] * q[size_t(row * w.in + k)] + b[size_t(g)];
  }
};

float stored_float(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF16: return f16_to_f32(t.ptr<uint16_t>()[i]);
    case DType::kBF16: return bf16_to_f32(t.ptr<uint16_t>()[i]);
    default: return t.ptr<float>()[i];
  }
}

double gaussian(Rng& rng) {
  const double u1 = (double(rng.next() >> 11) + 1.0) * 0x1.0p-53, u2 = double(rng.next() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::acos(-1.0) * u2);
}

// MLX's affine quantizer applied to Gaussian weights (s = (max - min) / qmax, b = min per group, stored in sdtype),
// so the codes cluster around the middle one as in real checkpoints; make_quant's uniform words are milder on
// errors that grow with the codes.
RefWeight make_ref_quant(int64_t n_stack, int64_t out, int64_t in, int bits, int group_size, DType sdtype, Rng& rng) {
  const Shape lead = n_stack > 0 ? Shape{n_stack} : Shape{};
  auto shape = [&](int64_t cols) {
    Shape s = lead;
    s.push_back(out);
    s.push_back(cols);
    return s;
  };
  const int64_t rows = std::max<int64_t>(n_stack, 1) * out, groups = in / group_size;
  const long qmax = (1L << bits) - 1;
  Tensor wt = make_host_tensor(DType::kU32, shape(in * bits / 32));  // zero-filled
  Tensor st = make_host_tensor(sdtype, shape(groups)), bt = make_host_tensor(sdtype, shape(groups));
  RefWeight r;
  r.q.resize(size_t(rows * in));
  r.s.resize(size_t(rows * groups));
  r.b.resize(size_t(rows * groups));
  std::vector<double> v(static_cast<size_t>(group_size));
  for (int64_t rg = 0; rg < rows * groups; ++rg) {  // (row, group), the layout of scales and biases
    for (double& e : v) e = 0.02 * gaussian(rng);
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    store_float(st, rg, float((*hi - *lo) / double(qmax)));
    store_float(bt, rg, float(*lo));
    const double s = stored_float(st, rg), b = stored_float(bt, rg);
    r.s[size_t(rg)] = s;
    r.b[size_t(rg)] = b;
    for (int64_t i = 0; i < group_size; ++i) {
      const long c = std::clamp(std::lround((v[size_t(i)] - b) / s), 0L, qmax);
      const int64_t k = (rg / groups) * in + (rg % groups) * group_size + i;  // (row, column) of the code
      r.q[size_t(k)] = uint8_t(c);
      wt.ptr<uint32_t>()[k * bits / 32] |= uint32_t(c) << (k * bits % 32);
    }
  }
  r.w = LinearWeight::quantized_from("test.q", wt, st, bt, QuantSpec{bits, group_size}, n_stack > 0);
  return r;
}

RefWeight make_ref_dense(int64_t n_stack, int64_t out, int64_t in, Rng& rng) {
  const Shape shape = n_stack > 0 ? Shape{n_stack, out, in} : Shape{out, in};
  Tensor t = host_random(DType::kBF16, shape, rng);
  RefWeight r;
  for (int64_t i = 0; i < t.numel(); ++i) r.s.push_back(stored_float(t, i));
  r.w = LinearWeight::dense_from("test.dense", t, n_stack > 0);
  return r;
}

double nmse_f64(const std::vector<float>& got, const std::vector<double>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    err += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    norm += ref[i] * ref[i];
  }
  return err / std::max(norm, 1e-30);
}

// linear (idx empty: expert 0, one x row per output row) or gather_linear (idx (n, k); per_slot: x (n, k, in))
// against the f64 product of the exact weight values: the CPU backend (to check the reference) and every mode.
void check_small(CudaOps& f, CudaBackend& cu, const RefWeight& r, int64_t n, int64_t k, bool per_slot, Rng& rng,
                 const std::string& what) {
  const LinearWeight& w = r.w;
  const bool gather = k > 0;
  const int64_t pairs = gather ? n * k : n;
  Tensor x =
      gather && per_slot ? host_random(DType::kF32, {n, k, w.in}, rng) : host_random(DType::kF32, {n, w.in}, rng);
  const std::vector<int32_t> ids = gather ? random_experts(n, k, w.n_stack, rng) : std::vector<int32_t>();
  std::vector<double> ref(size_t(pairs * w.out));
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t e = gather ? ids[size_t(p)] : 0, xrow = gather && !per_slot ? p / k : p;
    const float* xr = x.ptr<float>() + xrow * w.in;
    for (int64_t row = 0; row < w.out; ++row) {
      double acc = 0;
      for (int64_t c = 0; c < w.in; ++c) acc += r.value(e, row, c) * double(xr[c]);
      ref[size_t(p * w.out + row)] = acc;
    }
  }
  const Shape yshape = gather ? Shape{n, k, w.out} : Shape{n, w.out};
  const std::string shape = " experts " + std::to_string(w.n_stack) + " out " + std::to_string(w.out) + " in " +
                            std::to_string(w.in) + " k " + std::to_string(k) + " n_tokens " + std::to_string(n) +
                            (gather ? (per_slot ? " per-slot x" : " shared x") : "");
  Tensor idx = gather ? host_i32({n, k}, ids) : Tensor();
  Tensor cref = f.cpu.alloc(DType::kF32, yshape);
  if (gather) {
    f.cpu.gather_linear(w, x, idx, cref);
  } else {
    f.cpu.linear(w, x, cref);
  }
  EXPECT_LE(nmse_f64(f.down(cref), ref), kMatmul) << what << " [CPU backend]" << shape;
  const LinearWeight dw = cu.to_device(w);
  const Tensor dx = cu.to_device(x), didx = gather ? cu.to_device(idx) : Tensor();
  for (const GemmMode& m : kSmallModes) {
    MmaMode mode(m.env);
    Tensor got = cu.alloc(DType::kF32, yshape);
    if (gather) {
      cu.gather_linear(dw, dx, didx, got);
    } else {
      cu.linear(dw, dx, got);
    }
    EXPECT_LE(nmse_f64(f.down(got), ref), m.tol) << what << " [" << m.name << "]" << shape;
  }
}

TEST_F(CudaOps, MmaGoldenShapesQuantized) {
  Rng rng(108);
  const int64_t outs[] = {64, 96, 200, 512};
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (int64_t in : {64, 128, 256}) {
          if (in < gs) continue;
          const std::string what =
              "bits " + std::to_string(bits) + " group " + std::to_string(gs) + " scales " + dtype_str(sd);
          // Attention / lm_head projections; expert projections with gate/up (x shared by the k slots) and down
          // (one x row per slot), 8 or 16 experts, top-2 .. 8: each expert gets a handful of pairs or none.
          check_small(*this, cu(), make_ref_quant(0, outs[rng.below(4)], in, bits, gs, sd, rng), 5 + rng.below(16), 0,
                      false, rng, what);
          const int64_t experts = rng.below(2) ? 16 : 8, k = int64_t(2) << rng.below(3);
          const RefWeight ew = make_ref_quant(experts, outs[rng.below(4)], in, bits, gs, sd, rng);
          check_small(*this, cu(), ew, 5 + rng.below(16), k, false, rng, what);
          check_small(*this, cu(), ew, 5 + rng.below(16), k, true, rng, what);
        }
      }
    }
  }
}

TEST_F(CudaOps, MmaGoldenShapesDenseBf16) {
  Rng rng(109);
  // in 40 and 72: a zero-filled tail of the last 32-slice.
  for (int64_t in : {40, 64, 72, 128, 256}) {
    check_small(*this, cu(), make_ref_dense(0, 200, in, rng), 5 + rng.below(16), 0, false, rng, "dense bf16");
    const RefWeight ew = make_ref_dense(8, 96, in, rng);
    check_small(*this, cu(), ew, 5 + rng.below(16), 2, false, rng, "dense bf16");
    check_small(*this, cu(), ew, 5 + rng.below(16), 4, true, rng, "dense bf16");
  }
}

}  // namespace
}  // namespace moecel
