// Tests of the CPU matmul kernels (backend/cpu/matmul.h): every bits x group_size x scale dtype, dense
// dtypes, odd shapes, the gather path, errors, determinism, on both the SIMD and the scalar kernels.
// The reference packs its own random q values, dequantizes them in f64 and takes f64 dot products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/affine.h"

namespace moecel {
namespace {

// |y - ref| must stay within kTol * sum_i |w_i x_i| (+ a tiny absolute floor): f32 accumulation over a few
// hundred to a few thousand terms stays well inside 1e-5 of the magnitude of the terms.
constexpr double kTol = 1e-5;

// Rounds v to the storage dtype and writes it; returns the value actually stored.
double store(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; return v;
    case DType::kF16: {
      uint16_t h = f32_to_f16(v);
      static_cast<uint16_t*>(base)[i] = h;
      return f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h = f32_to_bf16(v);
      static_cast<uint16_t*>(base)[i] = h;
      return bf16_to_f32(h);
    }
    default: ADD_FAILURE() << "bad dtype"; return 0;
  }
}

// A zeroed host tensor of exactly its size (no padding), so AddressSanitizer builds catch any read past it.
Tensor exact_tensor(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  auto storage = std::shared_ptr<uint8_t[]>(new uint8_t[t.nbytes()]());
  t.data = storage.get();
  t.owner = std::shared_ptr<void>(storage, storage.get());
  return t;
}

// A random weight and its f64 dequantized copy (n_slices, out, in).
struct TestWeight {
  LinearWeight w;
  std::vector<double> ref;
  double at(int64_t e, int64_t r, int64_t i) const { return ref[size_t((e * w.out + r) * w.in + i)]; }
};

// bits = 0: dense of wdtype. n_stack = 0: 2-D.
TestWeight make_weight(int bits, int group_size, DType dtype, int64_t n_stack, int64_t out, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  TestWeight tw;
  LinearWeight& w = tw.w;
  w.name = "test.proj";
  w.bits = bits;
  w.group_size = bits ? group_size : 0;
  w.n_stack = n_stack;
  w.out = out;
  w.in = in;
  const int64_t slices = std::max<int64_t>(1, n_stack);
  auto shape = [&](int64_t cols) { return n_stack ? Shape{n_stack, out, cols} : Shape{out, cols}; };
  tw.ref.resize(size_t(slices * out * in));
  if (!bits) {
    w.weight = exact_tensor(dtype, shape(in));
    for (int64_t i = 0; i < slices * out * in; ++i) tw.ref[size_t(i)] = store(w.weight.data, dtype, i, uni(rng));
    return tw;
  }
  const int64_t groups = in / group_size, words = in * bits / 32;
  w.weight = exact_tensor(DType::kU32, shape(words));
  w.scales = exact_tensor(dtype, shape(groups));
  w.biases = exact_tensor(dtype, shape(groups));
  auto* packed = w.weight.ptr<uint32_t>();
  std::uniform_int_distribution<uint32_t> qd(0, (1u << bits) - 1);
  std::uniform_real_distribution<float> sd(0.002f, 0.05f);
  for (int64_t row = 0; row < slices * out; ++row) {
    std::vector<uint32_t> q(static_cast<size_t>(in));
    for (auto& v : q) v = qd(rng);
    // Own packer: value i at bit i * bits of the row's little-endian bit stream.
    uint32_t* pr = packed + row * words;
    for (int64_t i = 0; i < in; ++i)
      for (int b = 0; b < bits; ++b)
        if ((q[size_t(i)] >> b) & 1u) {
          int64_t bit = i * bits + b;
          pr[bit / 32] |= 1u << (bit % 32);
        }
    for (int64_t g = 0; g < groups; ++g) {
      float s = sd(rng);
      double sv = store(w.scales.data, dtype, row * groups + g, s);
      double bv = store(w.biases.data, dtype, row * groups + g, -s * float(1 << (bits - 1)) + 0.01f * uni(rng));
      for (int64_t i = g * group_size; i < (g + 1) * group_size; ++i)
        tw.ref[size_t(row * in + i)] = sv * double(q[size_t(i)]) + bv;
    }
  }
  return tw;
}

std::vector<float> random_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

// Checks every y[r] against the f64 dot of row r of slice e with x, within kTol of the magnitude of the terms.
void expect_dot(const TestWeight& tw, int64_t e, const float* x, const float* y, const std::string& what) {
  for (int64_t r = 0; r < tw.w.out; ++r) {
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < tw.w.in; ++i) {
      double p = tw.at(e, r, i) * double(x[i]);
      ref += p;
      mag += std::fabs(p);
    }
    double err = std::fabs(double(y[r]) - ref);
    ASSERT_LE(err, kTol * mag + 1e-30) << what << " row " << r << ": got " << y[r] << " want " << ref;
  }
}

// Runs `body` with every kernel level this CPU has: AVX-512 with VNNI, AVX-512, AVX2 and the portable kernels.
template <class F>
void all_paths(F body) {
  for (cpu::SimdLevel level :
       {cpu::SimdLevel::kAvx512Vnni, cpu::SimdLevel::kAvx512, cpu::SimdLevel::kAvx2, cpu::SimdLevel::kScalar}) {
    cpu::set_simd_level(level);
    if (cpu::simd_level() != level) continue;  // not on this CPU
    SCOPED_TRACE(cpu::simd_level_name(level));
    body();
  }
  cpu::set_simd_enabled(true);
}

void check_linear(const TestWeight& tw, int64_t expert, int64_t n_tokens, const std::string& what) {
  const int64_t xs = tw.w.in + 3, ys = tw.w.out + 5;  // strided rows
  std::vector<float> x = random_x(n_tokens * xs, uint32_t(n_tokens * 7 + expert));
  std::vector<float> y(size_t(n_tokens * ys), NAN);
  cpu::linear(tw.w, expert, x.data(), n_tokens, xs, y.data(), ys);
  for (int64_t t = 0; t < n_tokens; ++t) {
    expect_dot(tw, expert, x.data() + t * xs, y.data() + t * ys, what + " token " + std::to_string(t));
    for (int64_t r = tw.w.out; r < ys; ++r) ASSERT_TRUE(std::isnan(y[size_t(t * ys + r)])) << "wrote past out";
  }
}

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(CpuMatmul, QuantizedEveryFormat) {
  all_paths([] {
    for (int bits : {2, 3, 4, 5, 6, 8})
      for (int gs : {32, 64, 128})
        for (DType st : kFloatTypes) {
          const std::string what = fmt::format("bits {} gs {} scales {}", bits, gs, dtype_name(st));
          SCOPED_TRACE(what);
          // out = 37: not a multiple of any row blocking; 3 experts, the last one used.
          TestWeight tw = make_weight(bits, gs, st, 3, 37, 2 * gs + 128, uint32_t(bits * 1000 + gs));
          for (int64_t n : {1, 2, 3, 5, 17}) check_linear(tw, 2, n, what + " n_tokens " + std::to_string(n));
        }
  });
}

TEST(CpuMatmul, QuantizedWithoutBiases) {
  // A weight without biases dequantizes as scale * q.
  all_paths([] {
    for (int bits : {4, 6, 8}) {
      TestWeight tw = make_weight(bits, 64, DType::kBF16, 0, 19, 192, uint32_t(bits + 50));
      const int64_t groups = 192 / 64;
      for (int64_t r = 0; r < 19; ++r)
        for (int64_t g = 0; g < groups; ++g) {
          double bias = bf16_to_f32(tw.w.biases.ptr<uint16_t>()[r * groups + g]);
          for (int64_t i = g * 64; i < (g + 1) * 64; ++i) tw.ref[size_t(r * 192 + i)] -= bias;
        }
      tw.w.biases = Tensor{};
      for (int64_t n : {1, 6}) check_linear(tw, 0, n, fmt::format("bits {} no biases n {}", bits, n));
    }
  });
}

TEST(CpuMatmul, DenseEveryDtype) {
  all_paths([] {
    for (DType wt : kFloatTypes)
      for (int64_t in : {64, 67, 2048 + 5}) {
        const std::string what = fmt::format("dense {} in {}", dtype_name(wt), in);
        SCOPED_TRACE(what);
        TestWeight tw = make_weight(0, 0, wt, 0, 41, in, uint32_t(in));
        for (int64_t n : {1, 2, 3, 5, 17}) check_linear(tw, 0, n, what + " n_tokens " + std::to_string(n));
      }
  });
}

TEST(CpuMatmul, LargerShapesCrossBlocks) {
  // Several row blocks and K blocks (in > 1024), 4-bit group 64 F16 and dense BF16.
  all_paths([] {
    TestWeight q = make_weight(4, 64, DType::kF16, 0, 203, 2112, 5);
    for (int64_t n : {1, 2, 9}) check_linear(q, 0, n, "q4 2112");
    TestWeight d = make_weight(0, 0, DType::kBF16, 2, 131, 1500, 6);
    for (int64_t n : {1, 6}) check_linear(d, 1, n, "bf16 1500");
  });
}

void check_gather(const TestWeight& tw, int64_t n_tokens, int64_t k, bool per_slot, const std::vector<int32_t>& idx,
                  const std::string& what) {
  const int64_t in = tw.w.in, out = tw.w.out;
  std::vector<float> x = random_x((per_slot ? n_tokens * k : n_tokens) * in, uint32_t(n_tokens + 100 * k));
  std::vector<float> y(size_t(n_tokens * k * out), NAN);
  cpu::gather_linear(tw.w, x.data(), per_slot, idx.data(), n_tokens, k, y.data());
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const float* xr = x.data() + (per_slot ? t * k + j : t) * in;
      expect_dot(tw, idx[size_t(t * k + j)], xr, y.data() + (t * k + j) * out,
                 what + fmt::format(" token {} slot {}", t, j));
    }
}

TEST(CpuMatmul, GatherRepeatedExpertsBothInputLayouts) {
  all_paths([] {
    struct Fmt {
      int bits, gs;
      DType dt;
    };
    for (Fmt f : {Fmt{4, 64, DType::kF16}, Fmt{4, 32, DType::kBF16}, Fmt{8, 64, DType::kBF16}, Fmt{6, 128, DType::kF16},
                  Fmt{3, 32, DType::kF32}, Fmt{0, 0, DType::kBF16}, Fmt{0, 0, DType::kF32}}) {
      const std::string what = fmt::format("bits {} gs {} {}", f.bits, f.gs, dtype_name(f.dt));
      SCOPED_TRACE(what);
      TestWeight tw = make_weight(f.bits, f.gs, f.dt, 6, 45, 256, uint32_t(f.bits + 17));
      std::mt19937 rng(3);
      for (int64_t n : {1, 2, 5, 17})
        for (bool per_slot : {false, true}) {
          const int64_t k = 3;
          std::vector<int32_t> idx(size_t(n * k));
          for (auto& v : idx) v = int32_t(rng() % 6);
          idx[0] = idx[1] = 4;  // the same expert twice in one token
          if (n > 1) idx[3] = 4;
          check_gather(tw, n, k, per_slot, idx, what + fmt::format(" n {} per_slot {}", n, per_slot));
        }
      // Every token on one expert: the dequantize-once path with many tokens.
      std::vector<int32_t> same(34, 1);
      check_gather(tw, 17, 2, true, same, what + " all on expert 1");
    }
  });
}

TEST(CpuMatmul, ScalarSwitchSelectsPortableKernels) {
  cpu::set_simd_enabled(false);
  EXPECT_EQ(cpu::simd_level(), cpu::SimdLevel::kScalar);
  cpu::set_simd_enabled(true);
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    EXPECT_NE(cpu::simd_level(), cpu::SimdLevel::kScalar);
  }
#endif
}

TEST(CpuMatmul, InvalidExpertIndexThrows) {
  TestWeight tw = make_weight(4, 64, DType::kF16, 4, 8, 128, 9);
  std::vector<float> x(2 * 128, 1.0f), y(2 * 2 * 8);
  for (int32_t bad : {-1, 4, 1000}) {
    std::vector<int32_t> idx = {0, 1, 2, bad};
    EXPECT_THROW(cpu::gather_linear(tw.w, x.data(), false, idx.data(), 2, 2, y.data()), Error) << bad;
    EXPECT_THROW(cpu::linear(tw.w, bad, x.data(), 1, 128, y.data(), 8), Error) << bad;
  }
  TestWeight flat = make_weight(4, 64, DType::kF16, 0, 8, 128, 9);
  EXPECT_THROW(cpu::linear(flat.w, 1, x.data(), 1, 128, y.data(), 8), Error);
  std::vector<int32_t> zero = {0, 0};
  EXPECT_THROW(cpu::gather_linear(flat.w, x.data(), false, zero.data(), 1, 2, y.data()), Error);  // not stacked
  EXPECT_THROW(cpu::linear(flat.w, 0, x.data(), 1, 127, y.data(), 8), Error);                     // x stride < in
  LinearWeight broken = flat.w;
  broken.scales = broken.scales.reshaped({8, 1, 2});
  EXPECT_THROW(cpu::linear(broken, 0, x.data(), 1, 128, y.data(), 8), Error);
}

TEST(CpuMatmul, DeterministicAcrossThreadCounts) {
  TestWeight q = make_weight(4, 64, DType::kF16, 8, 300, 512, 11);
  std::vector<float> x = random_x(9 * 512, 12);
  std::vector<int32_t> idx(9 * 4);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t((i * 5) % 8);
  auto run = [&] {
    std::vector<float> y1(300), yg(9 * 4 * 300), yl(9 * 300);
    cpu::linear(q.w, 3, x.data(), 1, 512, y1.data(), 300);
    cpu::linear(q.w, 3, x.data(), 9, 512, yl.data(), 300);
    cpu::gather_linear(q.w, x.data(), false, idx.data(), 9, 4, yg.data());
    y1.insert(y1.end(), yl.begin(), yl.end());
    y1.insert(y1.end(), yg.begin(), yg.end());
    return y1;
  };
  const int saved = num_threads();
  set_num_threads(1);
  std::vector<float> a = run();
  set_num_threads(2);
  std::vector<float> b = run(), c = run();
  set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "1 vs 2 threads";
  EXPECT_EQ(0, std::memcmp(b.data(), c.data(), b.size() * 4)) << "rerun";
}

// y = w x at one level, as bits.
std::vector<float> linear_at(cpu::SimdLevel level, const TestWeight& tw, const std::vector<float>& x) {
  cpu::set_simd_level(level);
  std::vector<float> y(size_t(tw.w.out));
  cpu::linear(tw.w, 0, x.data(), 1, tw.w.in, y.data(), tw.w.out);
  cpu::set_simd_enabled(true);
  return y;
}

TEST(CpuMatmul, FixedPointKernelsOnWholeBlocks) {
  // The VNNI kernels take whole blocks of codes (in a multiple of 128 values for 4-bit, 64 for 6- and 8-bit)
  // and chunks of 16 groups: full and partial chunks, every group size and scale dtype, rows past a multiple of
  // 4, and inputs with an outlier and an all-zero group (the fixed point is per group).
  cpu::set_simd_level(cpu::SimdLevel::kAvx512Vnni);
  if (cpu::simd_level() != cpu::SimdLevel::kAvx512Vnni) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  for (int bits : {4, 6, 8})
    for (int gs : {32, 64, 128})
      for (DType st : kFloatTypes)
        for (int64_t in : {int64_t(2048), int64_t(16) * gs + 256}) {
          const std::string what = fmt::format("bits {} gs {} scales {} in {}", bits, gs, dtype_name(st), in);
          SCOPED_TRACE(what);
          TestWeight tw = make_weight(bits, gs, st, 0, 37, in, uint32_t(bits * 100 + gs + in));
          cpu::set_simd_level(cpu::SimdLevel::kAvx512Vnni);
          for (int variant = 0; variant < 3; ++variant) {
            std::vector<float> x = random_x(in, uint32_t(variant + in));
            if (variant == 1) x[size_t(in / 3)] = 900.0f;
            if (variant == 2) std::fill(x.begin() + gs, x.begin() + 2 * gs, 0.0f);
            std::vector<float> y(37);
            cpu::linear(tw.w, 0, x.data(), 1, in, y.data(), 37);
            expect_dot(tw, 0, x.data(), y.data(), what + fmt::format(" variant {}", variant));
          }
        }
  cpu::set_simd_enabled(true);
}

TEST(CpuMatmul, FixedPointKernelsHandOverInputsTheyCannotHold) {
  // A NaN or infinity, or a group's largest |x| beyond 2^100 or below 2^-100, takes the portable kernel: the
  // same bits as the scalar level.
  cpu::set_simd_level(cpu::SimdLevel::kAvx512Vnni);
  if (cpu::simd_level() != cpu::SimdLevel::kAvx512Vnni) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  for (int bits : {4, 6, 8}) {
    TestWeight tw = make_weight(bits, 64, DType::kBF16, 0, 21, 256, uint32_t(bits + 7));
    const float odd_values[] = {NAN, INFINITY, 3e30f, 1e-31f};
    for (float v : odd_values) {
      SCOPED_TRACE(fmt::format("bits {} value {}", bits, v));
      std::vector<float> x = random_x(256, 5);
      if (v < 1e-20f)
        for (int i = 64; i < 128; ++i) x[size_t(i)] *= v;  // a whole group far below 2^-100
      else
        x[70] = v;
      std::vector<float> fixed = linear_at(cpu::SimdLevel::kAvx512Vnni, tw, x);
      std::vector<float> portable = linear_at(cpu::SimdLevel::kScalar, tw, x);
      ASSERT_EQ(0, std::memcmp(fixed.data(), portable.data(), fixed.size() * 4));
      if (std::isfinite(v)) expect_dot(tw, 0, x.data(), fixed.data(), "finite");
    }
    // An ordinary vector does take the fixed point: not the portable kernel's bits.
    std::vector<float> x = random_x(256, 6);
    std::vector<float> fixed = linear_at(cpu::SimdLevel::kAvx512Vnni, tw, x);
    std::vector<float> portable = linear_at(cpu::SimdLevel::kScalar, tw, x);
    EXPECT_NE(0, std::memcmp(fixed.data(), portable.data(), fixed.size() * 4)) << "bits " << bits;
  }
}

TEST(CpuMatmul, AgreesWithAffineReferenceDequantize) {
  // The packing used by these tests matches quant/affine's reference unpacking.
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    TestWeight tw = make_weight(bits, 32, DType::kF32, 2, 3, 96, uint32_t(bits));
    std::vector<float> row(96);
    for (int64_t r = 0; r < 3; ++r) {
      dequantize_row(tw.w, 1, r, row.data());
      for (int64_t i = 0; i < 96; ++i)
        ASSERT_NEAR(row[size_t(i)], tw.at(1, r, i), 1e-6) << bits << " " << r << " " << i;
    }
  }
}

}  // namespace
}  // namespace moecel
