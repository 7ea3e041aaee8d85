// Benchmark of the CPU matmul kernels at OLMoE-1B-7B shapes (4-bit, group 64, F16 scales): validates every
// case against an f64 reference first, then times decode (1 token: GB/s of weights streamed from memory)
// and prefill (512 tokens: GFLOP/s) with 1 and 2 threads, and estimates whole-model tokens per second.
// Usage: bench_cpu_matmul [--quick] [--pool-mb N] [--threads N]   (MOECEL_CPU_SIMD=avx2|scalar caps the kernels)
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/affine.h"

namespace {

using namespace moecel;

constexpr int64_t kHidden = 2048, kExperts = 64, kTopK = 8, kFfn = 1024, kVocab = 50304, kLayers = 16;
constexpr int64_t kPrefill = 512;
constexpr int kBits = 4, kGroup = 64;

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint64_t next_rand() {  // xorshift64*
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 2685821657736338717ull;
}

// One pool of random packed weights, scales and biases, viewed with every benchmark shape. It is larger than
// the caches, and decode cases rotate through it so each call streams weights from memory.
struct Pool {
  Tensor packed, scales, biases;
  explicit Pool(size_t bytes) {
    const int64_t words = int64_t(bytes / 4);
    packed = make_host_tensor(DType::kU32, {words});
    auto* w = packed.ptr<uint32_t>();
    for (int64_t i = 0; i < words; i += 2) {
      uint64_t r = next_rand();
      w[i] = uint32_t(r);
      if (i + 1 < words) w[i + 1] = uint32_t(r >> 32);
    }
    const int64_t groups = words * (32 / kBits) / kGroup;
    scales = make_host_tensor(DType::kF16, {groups});
    biases = make_host_tensor(DType::kF16, {groups});
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.002f + 0.02f * float(next_rand() % 1000) / 1000.0f;
      scales.ptr<uint16_t>()[g] = f32_to_f16(s);
      biases.ptr<uint16_t>()[g] = f32_to_f16(-8.0f * s);
    }
  }
  // A (n_stack, out, in) view (n_stack = 0: 2-D); n_stack < 0 picks as many slices as fit.
  LinearWeight view(const char* name, int64_t n_stack, int64_t out, int64_t in) const {
    const int64_t wslice = out * in * kBits / 32;
    if (n_stack < 0) n_stack = packed.numel() / wslice;
    const int64_t n = std::max<int64_t>(1, n_stack);
    MOECEL_CHECK(n * wslice <= packed.numel(), "pool too small for {}", name);
    auto shaped = [&](const Tensor& t, int64_t cols) {
      Tensor v = t;
      v.shape = n_stack ? Shape{n_stack, out, cols} : Shape{out, cols};
      return v;
    };
    LinearWeight w;
    w.name = name;
    w.weight = shaped(packed, in * kBits / 32);
    w.scales = shaped(scales, in / kGroup);
    w.biases = shaped(biases, in / kGroup);
    w.bits = kBits;
    w.group_size = kGroup;
    w.n_stack = n_stack;
    w.out = out;
    w.in = in;
    return w;
  }
};

std::vector<float> random_vec(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(int64_t(next_rand() % 2001) - 1000) / 1000.0f;
  return v;
}

// f64 reference of output row r of slice e for input x.
double ref_dot(const LinearWeight& w, int64_t e, int64_t r, const float* x, double* mag) {
  std::vector<float> row(static_cast<size_t>(w.in));
  dequantize_row(w, e, r, row.data());
  double acc = 0;
  *mag = 0;
  for (int64_t i = 0; i < w.in; ++i) {
    acc += double(row[size_t(i)]) * x[i];
    *mag += std::fabs(double(row[size_t(i)]) * x[i]);
  }
  return acc;
}

int g_failures = 0;
void check(const char* what, const LinearWeight& w, int64_t e, int64_t r, const float* x, float got) {
  double mag, ref = ref_dot(w, e, r, x, &mag);
  if (std::fabs(got - ref) > 1e-5 * mag + 1e-30) {
    std::printf("VALIDATION FAILED %s expert %ld row %ld: got %.7g want %.7g\n", what, long(e), long(r), got, ref);
    ++g_failures;
  }
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Seconds per call, best mean over batches of calls (~20 ms each) within min_s: by the wall clock, and by this
// thread's CPU time (all the work when running on 1 thread). The best batch, not the mean, because this machine
// is shared: other processes only ever make a batch slower; CPU time also leaves out time the thread waited.
struct Timing {
  double wall = 1e30, cpu = 1e30;
};
Timing time_calls(const std::function<void(int64_t)>& fn, double min_s) {
  using Clock = std::chrono::steady_clock;
  fn(0);  // warm-up
  int64_t calls = 1, batch = 1;
  Timing best;
  const auto start = Clock::now();
  for (int b = 0;; ++b) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    for (int64_t i = 0; i < batch; ++i) fn(calls++);
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    best.wall = std::min(best.wall, el / double(batch));
    best.cpu = std::min(best.cpu, (thread_cpu_seconds() - c0) / double(batch));
    if (el < 0.02 && b < 4) batch *= 2;
    if (std::chrono::duration<double>(Clock::now() - start).count() > min_s && b >= 2) break;
  }
  return best;
}

// One result line: time per call and rate (amount / time / 1e9) by the wall clock, plus by CPU time on 1 thread.
void report(const char* phase, const char* name, const Timing& t, double amount, const char* unit) {
  const bool ms = t.wall > 1e-2;
  std::printf("  %-7s %-30s %9.1f %s %7.1f %s", phase, name, ms ? t.wall * 1e3 : t.wall * 1e6, ms ? "ms" : "us",
              amount / t.wall / 1e9, unit);
  if (num_threads() == 1) std::printf("   (cpu time: %7.1f %s)", amount / t.cpu / 1e9, unit);
  std::printf("\n");
}

// Sum of n 32-bit words with several independent accumulators (AVX2 where present): a plain streaming read.
// Integer adds, because the pool's random bits would make slow denormal floats.
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint32_t sum_words_avx2(const uint32_t* p, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_epi32(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi32(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a2 = _mm256_add_epi32(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)));
    a3 = _mm256_add_epi32(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 24)));
  }
  uint32_t out[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)));
  uint32_t s = 0;
  for (uint32_t v : out) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}
#endif

uint32_t sum_words(const uint32_t* p, int64_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return sum_words_avx2(p, n);
#endif
  uint32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

// Read bandwidth over the pool with the current thread count: the ceiling for decode.
double read_bandwidth(const Pool& pool, double min_s) {
  const auto* p = pool.packed.ptr<uint32_t>();
  const int64_t n = pool.packed.numel();
  std::vector<uint32_t> sink(1024);
  Timing t = time_calls(
      [&](int64_t) {
        parallel_for(n, 1 << 16,
                     [&](int64_t b, int64_t e) { sink[size_t(b >> 16) % 1024] += sum_words(p + b, e - b); });
      },
      min_s);
  return double(n) * 4 / t.wall / 1e9;
}

struct Times {
  Timing attn, gate_up, down, lm_head;  // decode, per call
  Timing p_attn, p_gate_up, p_down;     // prefill 512 tokens
};

Times run_all(const Pool& pool, double min_s, bool validate) {
  Times t{};
  std::printf("  memory read bandwidth (plain loop over the pool)     %7.1f GB/s\n", read_bandwidth(pool, min_s));
  std::vector<float> x = random_vec(kPrefill * kTopK * kHidden);  // large enough for every input
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(kVocab, kPrefill * kTopK * kHidden)));

  // ---- decode: one projection, 1 token, rotating over as many slices as the pool holds ----
  struct Dec {
    const char* name;
    int64_t out, in;
    Timing* slot;
  };
  Timing expert_up, expert_down;
  for (Dec d : {Dec{"expert gate/up 1024x2048", kFfn, kHidden, &expert_up},
                Dec{"expert down 2048x1024", kHidden, kFfn, &expert_down},
                Dec{"attention 2048x2048", kHidden, kHidden, &t.attn},
                Dec{"lm_head 50304x2048", kVocab, kHidden, &t.lm_head}}) {
    LinearWeight w = pool.view(d.name, -1, d.out, d.in);
    if (validate) {
      cpu::linear(w, w.n_stack - 1, x.data(), 1, d.in, y.data(), d.out);
      for (int64_t r = 0; r < d.out; r += std::max<int64_t>(1, d.out / 97))
        check(d.name, w, w.n_stack - 1, r, x.data(), y[size_t(r)]);
    }
    *d.slot = time_calls([&](int64_t i) { cpu::linear(w, i % w.n_stack, x.data(), 1, d.in, y.data(), d.out); }, min_s);
    report("decode", d.name, *d.slot, double(w.bytes_per_slice()), "GB/s");
  }

  // ---- decode: gather k=8 of 64 experts; each call uses the next 64-expert block of the pool (a "layer") ----
  {
    LinearWeight gu = pool.view("switch_mlp.gate_proj", -1, kFfn, kHidden);
    LinearWeight dn = pool.view("switch_mlp.down_proj", -1, kHidden, kFfn);
    const int64_t layers_gu = gu.n_stack / kExperts, layers_dn = dn.n_stack / kExperts;
    std::vector<int32_t> idx(kTopK);
    auto route = [&](int64_t call, int64_t layers) {
      const int64_t base = (call % layers) * kExperts;
      for (int64_t j = 0; j < kTopK; ++j) idx[size_t(j)] = int32_t(base + (call * 7 + j * 13) % kExperts);
    };
    if (validate) {
      route(3, layers_gu);
      cpu::gather_linear(gu, x.data(), false, idx.data(), 1, kTopK, y.data());
      for (int64_t j = 0; j < kTopK; ++j)
        for (int64_t r = 0; r < kFfn; r += 61)
          check("gather gate 1 token", gu, idx[size_t(j)], r, x.data(), y[size_t(j * kFfn + r)]);
      route(5, layers_dn);
      cpu::gather_linear(dn, x.data(), true, idx.data(), 1, kTopK, y.data());
      for (int64_t j = 0; j < kTopK; ++j)
        for (int64_t r = 0; r < kHidden; r += 113)
          check("gather down 1 token", dn, idx[size_t(j)], r, x.data() + j * kFfn, y[size_t(j * kHidden + r)]);
    }
    t.gate_up = time_calls(
        [&](int64_t i) {
          route(i, layers_gu);
          cpu::gather_linear(gu, x.data(), false, idx.data(), 1, kTopK, y.data());
        },
        min_s);
    report("decode", "gather gate/up k=8 of 64", t.gate_up, double(gu.bytes_per_slice()) * kTopK, "GB/s");
    t.down = time_calls(
        [&](int64_t i) {
          route(i, layers_dn);
          cpu::gather_linear(dn, x.data(), true, idx.data(), 1, kTopK, y.data());
        },
        min_s);
    report("decode", "gather down k=8 (x per slot)", t.down, double(dn.bytes_per_slice()) * kTopK, "GB/s");
  }

  // ---- prefill: 512 tokens ----
  {
    LinearWeight attn = pool.view("self_attn.q_proj", 0, kHidden, kHidden);
    if (validate) {
      cpu::linear(attn, 0, x.data(), kPrefill, kHidden, y.data(), kHidden);
      for (int64_t tk : {int64_t(0), int64_t(13), kPrefill - 1})
        for (int64_t r = 0; r < kHidden; r += 101)
          check("prefill attention", attn, 0, r, x.data() + tk * kHidden, y[size_t(tk * kHidden + r)]);
    }
    t.p_attn =
        time_calls([&](int64_t) { cpu::linear(attn, 0, x.data(), kPrefill, kHidden, y.data(), kHidden); }, min_s);
    report("prefill", "attention 2048x2048 x512", t.p_attn, 2.0 * kHidden * kHidden * kPrefill, "GFLOP/s");

    // Routing: 8 distinct random experts per token.
    std::vector<int32_t> idx(kPrefill * kTopK);
    for (int64_t tk = 0; tk < kPrefill; ++tk) {
      std::vector<int32_t> perm(kExperts);
      for (int32_t e = 0; e < kExperts; ++e) perm[size_t(e)] = e;
      for (int64_t j = 0; j < kTopK; ++j) {
        std::swap(perm[size_t(j)], perm[size_t(j + int64_t(next_rand() % uint64_t(kExperts - j)))]);
        idx[size_t(tk * kTopK + j)] = perm[size_t(j)];
      }
    }
    LinearWeight gu = pool.view("switch_mlp.gate_proj", kExperts, kFfn, kHidden);
    LinearWeight dn = pool.view("switch_mlp.down_proj", kExperts, kHidden, kFfn);
    if (validate) {
      cpu::gather_linear(gu, x.data(), false, idx.data(), kPrefill, kTopK, y.data());
      for (int64_t p : {int64_t(0), int64_t(777), kPrefill * kTopK - 1})
        for (int64_t r = 0; r < kFfn; r += 37)
          check("prefill gather gate", gu, idx[size_t(p)], r, x.data() + (p / kTopK) * kHidden,
                y[size_t(p * kFfn + r)]);
      cpu::gather_linear(dn, x.data(), true, idx.data(), kPrefill, kTopK, y.data());
      for (int64_t p : {int64_t(1), int64_t(2000), kPrefill * kTopK - 2})
        for (int64_t r = 0; r < kHidden; r += 71)
          check("prefill gather down", dn, idx[size_t(p)], r, x.data() + p * kFfn, y[size_t(p * kHidden + r)]);
    }
    const double flops_gather = 2.0 * kFfn * kHidden * kPrefill * kTopK;
    t.p_gate_up = time_calls(
        [&](int64_t) { cpu::gather_linear(gu, x.data(), false, idx.data(), kPrefill, kTopK, y.data()); }, min_s);
    report("prefill", "gather gate/up k=8 x512", t.p_gate_up, flops_gather, "GFLOP/s");
    t.p_down = time_calls(
        [&](int64_t) { cpu::gather_linear(dn, x.data(), true, idx.data(), kPrefill, kTopK, y.data()); }, min_s);
    report("prefill", "gather down k=8 x512", t.p_down, flops_gather, "GFLOP/s");
  }
  return t;
}

// Whole-model estimates from the matmul times alone (attention scores, norms, rope, routing not counted).
void estimate(const Times& t, double Timing::*clock, const char* label) {
  // Per decoded token: 16 layers x (q, k, v, o + the router (64 rows, ~1/32 of a projection) + gate, up, down
  // gathers) + lm_head.
  const double decode =
      kLayers * (4.03 * (t.attn.*clock) + 2 * (t.gate_up.*clock) + (t.down.*clock)) + (t.lm_head.*clock);
  // Prefill of 512 tokens: the same over all tokens at once; lm_head only for the last token.
  const double prefill =
      kLayers * (4.03 * (t.p_attn.*clock) + 2 * (t.p_gate_up.*clock) + (t.p_down.*clock)) + (t.lm_head.*clock);
  std::printf("  estimate (%s): decode %.1f tok/s (%.1f ms/token of matmuls), prefill %ld tokens %.1f tok/s (%.2f s)\n",
              label, 1.0 / decode, decode * 1e3, long(kPrefill), double(kPrefill) / prefill, prefill);
}

double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  size_t pool_mb = 1280;
  std::vector<int> thread_counts = {1, 2};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
      pool_mb = 512;
    } else if (a == "--pool-mb" && i + 1 < argc) {
      pool_mb = size_t(std::max(256, std::atoi(argv[++i])));
    } else if (a == "--threads" && i + 1 < argc) {
      thread_counts = {std::max(1, std::atoi(argv[++i]))};
    } else {
      std::fprintf(stderr, "usage: bench_cpu_matmul [--quick] [--pool-mb N] [--threads N]\n");
      return 2;
    }
  }
  try {
    std::printf("bench_cpu_matmul: OLMoE-1B-7B shapes, %d-bit group %d, F16 scales; kernels %s; weight pool %zu MB\n",
                kBits, kGroup, cpu::simd_level_name(cpu::simd_level()), pool_mb);
    Pool pool(pool_mb << 20);
    for (int threads : thread_counts) {
      set_num_threads(threads);
      std::printf("threads=%d (load average %.2f)\n", threads, load_average());
      Times t = run_all(pool, quick ? 0.3 : 1.0, threads == thread_counts[0]);
      if (g_failures) {
        std::printf("%d validation failures\n", g_failures);
        return 1;
      }
      estimate(t, &Timing::wall, "wall clock");
      if (threads == 1) estimate(t, &Timing::cpu, "cpu time");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
