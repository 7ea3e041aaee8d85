// The CPU matmul driver: validates weights and expert indices, groups gather pairs by expert, picks the
// kernel set for the CPU, and spreads rows over the thread pool. One token per weight slice runs the
// matrix-vector kernels (decode, memory bound); more tokens dequantize a block of rows to f32 once and run
// the register-blocked f32 kernel over all of them (prefill, compute bound).
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/matmul_internal.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace moecel::cpu {
namespace {

using detail::Kernels;
using detail::Slice;

// A weight slice with fewer tokens than this takes the matrix-vector path once per token (row chunk by row
// chunk, so the weights come from memory once): up to 3 tokens that beats dequantizing the rows to f32 once
// and running the f32 kernel (measured, 4-bit, AVX2 and AVX-512).
constexpr int64_t kGemmMinTokens = 4;
// The f32 kernel works on blocks of dequantized rows (kept in L2) and slices of K (one token tile of x stays
// in L1). Sizes tuned on a 2 MB-L2 Xeon: 576 KB blocks, K slices of 1024.
constexpr int64_t kRowBlockBytes = 576 * 1024;
constexpr int64_t kRowBlockMin = 12, kRowBlockMax = 96;  // multiples of 12: every micro-kernel's row count divides it
constexpr int64_t kKBlock = 1024;
// Rows per piece of the matrix-vector path (run_parts): 32 rows of a 2048-wide 4-bit weight are 36 KB, enough
// that taking a piece costs nothing next to it, few enough that the threads end together.
constexpr int64_t kGemvPiece = 32;

// ---- SIMD level ----

SimdLevel detect_level() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  return vnni ? SimdLevel::kAvx512Vnni : avx512 ? SimdLevel::kAvx512 : avx2 ? SimdLevel::kAvx2 : SimdLevel::kScalar;
#else
  return SimdLevel::kScalar;
#endif
}

SimdLevel env_cap() {
  const char* v = std::getenv("MOECEL_CPU_SIMD");
  if (!v || !*v) return SimdLevel::kAvx512Vnni;
  std::string s(v);
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "0" || s == "off" || s == "false" || s == "no" || s == "scalar") return SimdLevel::kScalar;
  if (s == "avx2") return SimdLevel::kAvx2;
  if (s == "avx512") return SimdLevel::kAvx512;
  if (s == "avx512vnni" || s == "vnni" || s == "best" || s == "1" || s == "on" || s == "true" || s == "yes") {
    return SimdLevel::kAvx512Vnni;
  }
  // A typo must not silently benchmark a different kernel set than the one asked for.
  fail("MOECEL_CPU_SIMD='{}': expected scalar (or 0/off), avx2, avx512, avx512vnni or best", v);
}

SimdLevel best_level() {
  static const SimdLevel level = detect_level();
  return level;
}

std::atomic<int>& level_slot() {
  static std::atomic<int> level{int(std::min(best_level(), env_cap()))};
  return level;
}

// ---- per-thread scratch, 64-byte aligned ----

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

float* scratch(int slot, size_t n_floats) {
  thread_local std::unique_ptr<float, FreeDeleter> bufs[2];
  thread_local size_t sizes[2] = {0, 0};
  if (sizes[slot] < n_floats) {
    size_t bytes = ((n_floats * sizeof(float) + 63) / 64) * 64;
    sizes[slot] = 0;
    bufs[slot].reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    MOECEL_CHECK(bufs[slot] != nullptr, "cpu matmul: out of memory for a {}-byte scratch buffer", bytes);
    sizes[slot] = n_floats;
  }
  return bufs[slot].get();
}

}  // namespace

// ---- shared with the fused decode-MoE path (matmul_internal.h) ----
namespace detail {

Slice make_slice(const LinearWeight& w, int64_t expert) {
  Slice s;
  s.out = w.out;
  s.in = w.in;
  s.bits = w.bits;
  s.wdtype = w.weight.dtype;
  s.row_bytes = w.quantized() ? w.in * w.bits / 8 : w.in * int64_t(dtype_size(w.weight.dtype));
  const auto* base = static_cast<const uint8_t*>(w.weight.data);
  s.w = base + expert * w.out * s.row_bytes;
  s.w_end = base + w.weight.nbytes();
  if (w.quantized()) {
    s.group_size = w.group_size;
    s.groups = w.in / w.group_size;
    s.sdtype = w.scales.dtype;
    int64_t sbytes = s.groups * int64_t(dtype_size(s.sdtype));
    s.scales = static_cast<const uint8_t*>(w.scales.data) + expert * w.out * sbytes;
    if (w.biases.data) s.biases = static_cast<const uint8_t*>(w.biases.data) + expert * w.out * sbytes;
  }
  return s;
}

Kernels select_kernels(const Slice& s) {
  Kernels k;
  detail::scalar_kernels(s, k);
#if defined(__x86_64__)
  SimdLevel level = simd_level();
  if (level >= SimdLevel::kAvx2) detail::avx2_kernels(s, k);
  if (level >= SimdLevel::kAvx512) detail::avx512_kernels(s, k);
  if (level >= SimdLevel::kAvx512Vnni) detail::avx512_vnni_kernels(s, k);
#endif
  return k;
}

// Runs fn(task) for every task in [0, n_tasks), handed out dynamically to the pool's threads so a thread
// slowed by other work on the machine does not hold up the rest. Every output value is computed by one task
// in a fixed order, so results never depend on which thread ran it.
void run_tasks(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1) return fn(0);
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(num_threads(), n_tasks), 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < n_tasks;
         t = next.fetch_add(1, std::memory_order_relaxed))
      fn(t);
  });
}

namespace {

// A part's remaining pieces [begin, end), packed as end << 32 | begin so that the owner (from the front) and
// thieves (from the back) take them with one compare-and-swap. On its own cache line: the owner's takes stay
// in its core.
struct alignas(64) Part {
  std::atomic<uint64_t> range{0};
};

constexpr int64_t kPiecesPerPart = 8;

uint64_t pack(int64_t begin, int64_t end) {
  return uint64_t(end) << 32 | uint64_t(begin);
}

// Takes the first (front) or last (back) piece left in p; false when none is.
bool take(Part& p, bool front, int64_t& piece) {
  uint64_t v = p.range.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t b = int64_t(v & 0xffffffffu), e = int64_t(v >> 32);
    if (b >= e) return false;
    piece = front ? b : e - 1;
    if (p.range.compare_exchange_weak(v, front ? pack(b + 1, e) : pack(b, e - 1), std::memory_order_relaxed))
      return true;
  }
}

}  // namespace

// Contiguous parts rather than pieces dealt out in turn: a thread's rows then stream from memory in order,
// which the hardware prefetchers follow (4-bit matrix-vector products on two threads of a Xeon: ~21 GB/s
// against ~16 with 64-row tasks handed out alternately; docs/benchmarks.md).
void run_parts(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  MOECEL_CHECK(grain > 0 && (n + grain - 1) / grain < (int64_t(1) << 31), "run_parts: {} items in pieces of {}", n,
               grain);
  // Each call costs something (~0.3 us per piece of a 4-bit matrix-vector product, measured): pieces grow
  // to an eighth of a part where the parts are large, fine enough still for the threads to end together.
  const int64_t threads = num_threads();
  grain = std::max(grain, (n + threads * kPiecesPerPart - 1) / (threads * kPiecesPerPart) / grain * grain);
  const int64_t pieces = (n + grain - 1) / grain;
  auto run = [&](int64_t piece) { fn(piece * grain, std::min(n, (piece + 1) * grain)); };
  const int64_t n_parts = std::min<int64_t>(threads, pieces);
  if (n_parts <= 1) {
    for (int64_t piece = 0; piece < pieces; ++piece) run(piece);
    return;
  }
  std::vector<Part> parts(static_cast<size_t>(n_parts));
  for (int64_t t = 0; t < n_parts; ++t)
    parts[size_t(t)].range.store(pack(pieces * t / n_parts, pieces * (t + 1) / n_parts), std::memory_order_relaxed);
  // A nested call runs serially: one caller then gets every part, and takes them all in turn.
  parallel_for(n_parts, 1, [&](int64_t t0, int64_t t1) {
    int64_t piece = 0;
    for (int64_t t = t0; t < t1; ++t) {
      while (take(parts[size_t(t)], true, piece)) run(piece);
      for (int64_t o = 1; o < n_parts; ++o)
        while (take(parts[size_t((t + o) % n_parts)], false, piece)) run(piece);
    }
  });
}

}  // namespace detail

namespace {

using detail::make_slice;
using detail::run_tasks;
using detail::select_kernels;

// ---- matrix-vector path ----

// One weight slice and the (fewer than kGemmMinTokens) prepared inputs that use it.
struct GemvJob {
  Slice slice;
  int n = 0;
  const float* px[kGemmMinTokens - 1];  // prepared inputs
  float* y[kGemmMinTokens - 1];         // (out,) each
};

void run_gemv(const std::vector<GemvJob>& jobs, int64_t out, const Kernels& k) {
  if (jobs.empty() || out == 0) return;
  const int64_t total = int64_t(jobs.size()) * out;
  detail::run_parts(total, kGemvPiece, [&](int64_t b, int64_t e) {
    while (b < e) {  // a piece may span the end of one job and the start of the next
      const GemvJob& j = jobs[size_t(b / out)];
      int64_t r0 = b % out, r1 = std::min(out, r0 + (e - b));
      // Token after token over the same rows: the later ones read the weights from cache, not memory.
      for (int t = 0; t < j.n; ++t) k.gemv(j.slice, j.px[t], r0, r1, j.y[t]);
      b += r1 - r0;
    }
  });
}

// ---- dequantize + f32 kernel path ----

struct GemmJob {
  Slice slice;
  std::vector<const float*> x;  // token rows (in,)
  std::vector<float*> y;        // output rows (out,)
};

int64_t row_block(int64_t in) {
  int64_t rows = kRowBlockBytes / (in * int64_t(sizeof(float)));
  rows = (rows / kRowBlockMin) * kRowBlockMin;
  return std::clamp(rows, kRowBlockMin, kRowBlockMax);
}

void run_gemm(const std::vector<GemmJob>& jobs, int64_t out, int64_t in, const Kernels& k) {
  if (jobs.empty() || out == 0) return;
  const int64_t mb = row_block(in), n_rb = (out + mb - 1) / mb;
  const int64_t ld = (in + 15) / 16 * 16;
  // Tasks are (job, row block) pairs: experts get different numbers of tokens.
  run_tasks(int64_t(jobs.size()) * n_rb, [&](int64_t task) {
    const GemmJob& j = jobs[size_t(task / n_rb)];
    const int64_t r0 = (task % n_rb) * mb, r1 = std::min(out, r0 + mb);
    const float* wrows;
    int64_t ldw;
    if (!j.slice.bits && j.slice.wdtype == DType::kF32) {
      wrows = reinterpret_cast<const float*>(j.slice.w + r0 * j.slice.row_bytes);
      ldw = in;
    } else {
      float* buf = scratch(1, size_t(mb * ld));
      k.dequant(j.slice, r0, r1, buf, ld);
      wrows = buf;
      ldw = ld;
    }
    const int64_t n_tok = int64_t(j.x.size());
    for (int64_t k0 = 0; k0 < in; k0 += kKBlock)
      k.gemm(wrows, ldw, r1 - r0, j.x.data(), n_tok, k0, std::min(kKBlock, in - k0), j.y.data(), r0, k0 > 0);
  });
}

}  // namespace

SimdLevel simd_level() {
  return SimdLevel(level_slot().load(std::memory_order_relaxed));
}

void set_simd_level(SimdLevel level) {
  level_slot().store(int(std::min(best_level(), level)), std::memory_order_relaxed);
}

void set_simd_enabled(bool enabled) {
  set_simd_level(enabled ? SimdLevel::kAvx512Vnni : SimdLevel::kScalar);
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

void linear(const LinearWeight& w, int64_t expert, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
            int64_t y_stride) {
  check_linear_weight(w, "linear", Device::kCpu);
  int64_t n_slices = std::max<int64_t>(1, w.n_stack);
  MOECEL_CHECK(expert >= 0 && expert < n_slices, "linear: weight {}: expert index {} out of range [0, {})", w.name,
               expert, n_slices);
  MOECEL_CHECK(n_tokens >= 0, "linear: weight {}: n_tokens {} is negative", w.name, n_tokens);
  MOECEL_CHECK(x_stride >= w.in && y_stride >= w.out, "linear: weight {}: strides x={} y={} below in={} out={}", w.name,
               x_stride, y_stride, w.in, w.out);
  if (n_tokens == 0 || w.out == 0) return;
  MOECEL_CHECK(x != nullptr && y != nullptr, "linear: weight {}: null input or output", w.name);
  Slice s = make_slice(w, expert);
  Kernels k = select_kernels(s);
  if (n_tokens < kGemmMinTokens) {
    const int64_t pf = detail::prep_floats(s);
    float* px = scratch(0, size_t(pf * n_tokens));
    std::vector<GemvJob> jobs(1);
    jobs[0].slice = s;
    jobs[0].n = int(n_tokens);
    for (int64_t t = 0; t < n_tokens; ++t) {
      k.prep(s, x + t * x_stride, px + t * pf);
      jobs[0].px[t] = px + t * pf;
      jobs[0].y[t] = y + t * y_stride;
    }
    run_gemv(jobs, w.out, k);
    return;
  }
  std::vector<GemmJob> jobs(1);
  jobs[0].slice = s;
  for (int64_t t = 0; t < n_tokens; ++t) {
    jobs[0].x.push_back(x + t * x_stride);
    jobs[0].y.push_back(y + t * y_stride);
  }
  run_gemm(jobs, w.out, w.in, k);
}

void gather_linear(const LinearWeight& w, const float* x, bool x_per_slot, const int32_t* indices, int64_t n_tokens,
                   int64_t k, float* y) {
  check_linear_weight(w, "gather_linear", Device::kCpu);
  MOECEL_CHECK(w.n_stack > 0, "gather_linear: weight {} has no experts axis", w.name);
  MOECEL_CHECK(n_tokens >= 0 && k >= 0, "gather_linear: weight {}: bad n_tokens={} k={}", w.name, n_tokens, k);
  const int64_t n_pairs = n_tokens * k;
  if (n_pairs == 0) return;
  MOECEL_CHECK(x != nullptr && y != nullptr && indices != nullptr, "gather_linear: weight {}: null pointer", w.name);
  // Stable counting sort of the (token, slot) pairs by expert.
  std::vector<int64_t> start(size_t(w.n_stack) + 1, 0);
  for (int64_t p = 0; p < n_pairs; ++p) {
    int32_t e = indices[p];
    MOECEL_CHECK(e >= 0 && e < w.n_stack,
                 "gather_linear: weight {}: expert index {} (token {}, slot {}) out of range "
                 "[0, {})",
                 w.name, e, p / k, p % k, w.n_stack);
    ++start[size_t(e) + 1];
  }
  for (int64_t e = 0; e < w.n_stack; ++e) start[size_t(e) + 1] += start[size_t(e)];
  std::vector<int64_t> order(static_cast<size_t>(n_pairs));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < n_pairs; ++p) order[size_t(fill[size_t(indices[p])]++)] = p;
  }
  auto x_row = [&](int64_t p) { return x + (x_per_slot ? p : p / k) * w.in; };

  Kernels kern = select_kernels(make_slice(w, 0));  // one format for all experts
  std::vector<GemvJob> gemv_jobs;
  std::vector<GemmJob> gemm_jobs;
  std::vector<int64_t> gemv_pairs;  // pairs of the experts with fewer than kGemmMinTokens, in expert order
  for (int64_t e = 0; e < w.n_stack; ++e) {
    int64_t c = start[size_t(e) + 1] - start[size_t(e)];
    if (c == 0) continue;
    if (c < kGemmMinTokens) {
      gemv_jobs.emplace_back();
      gemv_jobs.back().slice = make_slice(w, e);
      for (int64_t i = start[size_t(e)]; i < start[size_t(e) + 1]; ++i) gemv_pairs.push_back(order[size_t(i)]);
      continue;
    }
    GemmJob job;
    job.slice = make_slice(w, e);
    for (int64_t i = start[size_t(e)]; i < start[size_t(e) + 1]; ++i) {
      job.x.push_back(x_row(order[size_t(i)]));
      job.y.push_back(y + order[size_t(i)] * w.out);
    }
    gemm_jobs.push_back(std::move(job));
  }
  if (!gemv_pairs.empty()) {
    // Prepare each distinct input row once (with a shared x, the k slots of a token reuse it).
    Slice s0 = make_slice(w, 0);
    const int64_t pf = detail::prep_floats(s0);
    const int64_t n_rows = x_per_slot ? n_pairs : n_tokens;
    std::vector<int64_t> slot_of(size_t(n_rows), -1);
    int64_t n_prepped = 0;
    for (int64_t p : gemv_pairs) {
      int64_t r = x_per_slot ? p : p / k;
      if (slot_of[size_t(r)] < 0) slot_of[size_t(r)] = n_prepped++;
    }
    float* px = scratch(0, size_t(pf * n_prepped));
    for (int64_t r = 0; r < n_rows; ++r)
      if (slot_of[size_t(r)] >= 0) kern.prep(s0, x + r * w.in, px + slot_of[size_t(r)] * pf);
    size_t job = 0;
    for (size_t i = 0; i < gemv_pairs.size(); ++i) {
      const int64_t p = gemv_pairs[i];
      if (i > 0 && indices[p] != indices[gemv_pairs[i - 1]]) ++job;
      GemvJob& j = gemv_jobs[job];
      j.px[j.n] = px + slot_of[size_t(x_per_slot ? p : p / k)] * pf;
      j.y[j.n++] = y + p * w.out;
    }
    run_gemv(gemv_jobs, w.out, kern);
  }
  run_gemm(gemm_jobs, w.out, w.in, kern);
}

}  // namespace moecel::cpu
