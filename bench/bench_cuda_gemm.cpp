// Benchmark of the CUDA tiled matrix products at OLMoE-1B-7B prefill shapes (pp512 by default): the CUDA-core
// kernel (qgemm.cu) against the tensor-core kernel (qgemm_mma.cu) with split-x and bf16-x precision. Every case
// is validated first against an f64 reference on sampled outputs, then timed with CUDA events, L2 flushed before
// each repeat; the summary sums one forward's GEMMs (16 layers). Built only with the CUDA backend.
// Usage: bench_cuda_gemm [--tokens N] [--reps N] [--bits 4|8] [--group 32|64|128] [--lm-head]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/qmatmul.cuh"
#include "core/half.h"

namespace {

using namespace moecel;
using namespace moecel::cuda;

constexpr int64_t kHidden = 2048, kExperts = 64, kTopK = 8, kFfn = 1024, kVocab = 50304, kLayers = 16;

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DeviceBuf() { cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <class T>
void upload(DeviceBuf& d, const std::vector<T>& h) {
  CUDA_CHECK(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// One product of a forward pass: a plain linear (n_stack 0) or a gather over n_stack experts, k slots per token.
struct Case {
  const char* name;
  int64_t n_stack, out, in;
  bool per_slot;    // gather: one x row per (token, slot) instead of one per token
  int per_forward;  // how many such products one forward runs
  int bits, group;
};

enum class Kernel { kSimt, kMmaSplit, kMmaFast };
const char* kernel_name(Kernel k) {
  return k == Kernel::kSimt ? "cuda cores" : k == Kernel::kMmaSplit ? "mma split-x" : "mma bf16-x";
}

struct Result {
  double us = 0, nmse = 0;
  bool ok = true;
};

class Bench {
 public:
  Bench(int64_t tokens, int reps) : tokens_(tokens), reps_(reps), flush_(size_t(256) << 20) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, tokens %lld, %d repeats (median), L2 flushed before each\n", prop.name,
                prop.multiProcessorCount, static_cast<long long>(tokens), reps);
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    ctx_.sm_count = prop.multiProcessorCount;
    ctx_.max_smem_optin = int(prop.sharedMemPerBlockOptin);
    CUDA_CHECK(cudaEventCreate(&start_));
    CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Bench() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(ctx_.stream);
  }

  // Runs every kernel on the case; returns the time of each (index: Kernel).
  std::vector<Result> run(const Case& c) {
    std::mt19937_64 rng(uint64_t(c.out * 7919 + c.in * 31 + c.bits));
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const int64_t n_stack = std::max<int64_t>(1, c.n_stack);
    const bool gather = c.n_stack > 0;
    const int64_t k = gather ? kTopK : 1, n_pairs = tokens_ * k;
    const int64_t words = c.in * c.bits / 32, groups = c.in / c.group;
    std::vector<uint32_t> w(size_t(n_stack * c.out * words));
    for (uint32_t& v : w) v = uint32_t(rng());
    const float qmax = float((1 << c.bits) - 1);
    std::vector<uint16_t> s(size_t(n_stack * c.out * groups)), b(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = f32_to_bf16((1.0f + 0.5f * unit(rng)) / qmax);
      b[i] = f32_to_bf16(-0.5f + 0.1f * unit(rng));
    }
    const int64_t x_rows = gather && c.per_slot ? n_pairs : tokens_;
    std::vector<float> x(size_t(x_rows * c.in));
    for (float& v : x) v = unit(rng);
    std::vector<int32_t> idx;
    for (int64_t t = 0; t < tokens_ && gather; ++t) {  // k distinct experts per token
      std::vector<int32_t> perm(size_t(c.n_stack));
      std::iota(perm.begin(), perm.end(), 0);
      for (int64_t j = 0; j < k; ++j) {
        std::swap(perm[size_t(j)], perm[size_t(j + int64_t(rng() % uint64_t(c.n_stack - j)))]);
        idx.push_back(perm[size_t(j)]);
      }
    }

    DeviceBuf dw(w.size() * 4), ds(s.size() * 2), db(b.size() * 2), dx(x.size() * 4), dy(size_t(n_pairs * c.out) * 4);
    DeviceBuf didx(std::max<size_t>(idx.size(), 1) * 4), scratch(route_scratch_bytes(n_stack, n_pairs));
    DeviceBuf gemm_scratch(gemm_scratch_bytes(n_pairs, c.in));  // the f16 split of x
    upload(dw, w);
    upload(ds, s);
    upload(db, b);
    upload(dx, x);
    if (gather) upload(didx, idx);
    WeightView view;
    view.w = dw.p;
    view.scales = ds.p;
    view.biases = db.p;
    view.stype = FloatType::kBF16;
    view.n_stack = n_stack;
    view.out = c.out;
    view.in = c.in;
    view.bits = c.bits;
    view.group_size = c.group;
    const PairMap map{gather ? didx.as<int32_t>() : nullptr, k, !gather || c.per_slot};

    TileList tiles{};
    int64_t max_tiles = 0;
    if (gather) {
      tiles = launch_route(ctx_, view, didx.as<int32_t>(), n_pairs, dy.as<float>(), scratch.p, &max_tiles);
      const double route_us = time_us(
          [&] { launch_route(ctx_, view, didx.as<int32_t>(), n_pairs, dy.as<float>(), scratch.p, &max_tiles); });
      std::printf("  %-34s routing kernel %8.1f us\n", c.name, route_us);
    }
    auto launch = [&](Kernel kern) {
      if (kern == Kernel::kSimt) {
        launch_gemm_simt(ctx_, view, dx.as<float>(), map, n_pairs, gather ? &tiles : nullptr, max_tiles,
                         dy.as<float>());
        return;
      }
      const MmaPrecision p = kern == Kernel::kMmaSplit ? MmaPrecision::kSplitX : MmaPrecision::kBf16X;
      if (!launch_gemm_mma(ctx_, view, dx.as<float>(), map, n_pairs, gather ? &tiles : nullptr, max_tiles,
                           dy.as<float>(), p, gemm_scratch.p)) {
        throw std::runtime_error("the tensor-core kernel declined the case");
      }
    };

    // Sampled outputs against an f64 reference of the dequantized product.
    std::vector<int64_t> sample_pairs, sample_rows;
    for (int i = 0; i < 600; ++i) {
      sample_pairs.push_back(int64_t(rng() % uint64_t(n_pairs)));
      sample_rows.push_back(int64_t(rng() % uint64_t(c.out)));
    }
    std::vector<double> ref;
    const uint32_t mask = (1u << c.bits) - 1u;
    for (size_t i = 0; i < sample_pairs.size(); ++i) {
      const int64_t p = sample_pairs[i], r = sample_rows[i];
      const int64_t e = gather ? idx[size_t(p)] : 0, xr = gather ? (c.per_slot ? p : p / k) : p;
      const int64_t row = e * c.out + r;
      double acc = 0;
      for (int64_t j = 0; j < c.in; ++j) {
        const int64_t bit = j * c.bits;
        const uint32_t q = (w[size_t(row * words + bit / 32)] >> (bit % 32)) & mask;
        const size_t g = size_t(row * groups + j / c.group);
        acc += (double(bf16_to_f32(s[g])) * q + double(bf16_to_f32(b[g]))) * double(x[size_t(xr * c.in + j)]);
      }
      ref.push_back(acc);
    }

    std::vector<Result> results;
    std::vector<float> y(size_t(n_pairs * c.out));
    for (Kernel kern : {Kernel::kSimt, Kernel::kMmaSplit, Kernel::kMmaFast}) {
      Result res;
      CUDA_CHECK(cudaMemsetAsync(dy.p, 0xff, y.size() * 4, ctx_.stream));  // NaN: every output must be written
      launch(kern);
      CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
      CUDA_CHECK(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost));
      double err = 0, norm = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double d = double(y[size_t(sample_pairs[i] * c.out + sample_rows[i])]) - ref[i];
        err += d * d;
        norm += ref[i] * ref[i];
      }
      res.nmse = err / std::max(norm, 1e-30);
      res.ok = res.nmse <= (kern == Kernel::kMmaFast ? 2e-5 : 1e-7);  // NaN fails too
      res.us = time_us([&] { launch(kern); });
      const double flop = 2.0 * double(n_pairs) * double(c.out) * double(c.in);
      const double weight_bytes = double(w.size()) * 4 + double(s.size() + b.size()) * 2;
      std::printf("  %-34s %-12s %8.1f us %7.1f TFLOP/s %7.0f GB/s(w)  nmse %.2e %s\n", c.name, kernel_name(kern),
                  res.us, flop / res.us * 1e-6, weight_bytes / res.us * 1e-3, res.nmse, res.ok ? "" : "FAILED");
      results.push_back(res);
    }
    return results;
  }

 private:
  template <class F>
  double time_us(F&& launch) {
    std::vector<double> t;
    for (int r = 0; r < reps_; ++r) {
      CUDA_CHECK(cudaMemsetAsync(flush_.p, r & 0xff, size_t(256) << 20, ctx_.stream));
      CUDA_CHECK(cudaEventRecord(start_, ctx_.stream));
      launch();
      CUDA_CHECK(cudaEventRecord(stop_, ctx_.stream));
      CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      t.push_back(double(ms) * 1e3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

  int64_t tokens_;
  int reps_;
  Ctx ctx_;
  DeviceBuf flush_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

int run_main(int argc, char** argv) {
  int64_t tokens = 512;
  int reps = 20, bits = 4, group = 64;
  bool lm_head = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> long {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (a == "--tokens") {
      tokens = value();
    } else if (a == "--reps") {
      reps = int(value());
    } else if (a == "--bits") {
      bits = int(value());
    } else if (a == "--group") {
      group = int(value());
    } else if (a == "--lm-head") {
      lm_head = true;
    } else {
      std::fprintf(stderr, "usage: bench_cuda_gemm [--tokens N] [--reps N] [--bits 4|8] [--group N] [--lm-head]\n");
      return 2;
    }
  }
  if (tokens < 1 || reps < 1 || (bits != 4 && bits != 8) || (group != 32 && group != 64 && group != 128)) {
    std::fprintf(stderr, "bad arguments: tokens >= 1, reps >= 1, bits 4 or 8, group 32, 64 or 128\n");
    return 2;
  }
  // OLMoE-1B-7B per layer: q, k, v, o; the router (8-bit in mlx-community's 4-bit checkpoints); gate and up
  // gathers sharing x; the down gather with one x row per slot.
  std::vector<Case> cases = {
      {"q/k/v/o 2048x2048", 0, kHidden, kHidden, false, 4, bits, group},
      {"router 64x2048 (8-bit)", 0, kExperts, kHidden, false, 1, 8, 64},
      {"experts gate/up 64x1024x2048", kExperts, kFfn, kHidden, false, 2, bits, group},
      {"experts down 64x2048x1024", kExperts, kHidden, kFfn, true, 1, bits, group},
  };
  if (lm_head) cases.push_back({"lm_head 50304x2048 (once)", 0, kVocab, kHidden, false, 0, bits, group});
  Bench bench(tokens, reps);
  std::vector<double> per_layer(3, 0.0), head(3, 0.0);
  bool ok = true;
  for (const Case& c : cases) {
    const std::vector<Result> r = bench.run(c);
    for (size_t j = 0; j < r.size(); ++j) {
      ok = ok && r[j].ok;
      if (c.per_forward > 0) {
        per_layer[j] += r[j].us * c.per_forward;
      } else {
        head[j] += r[j].us;
      }
    }
  }
  std::printf("\none forward of %lld tokens (%lld layers%s), GEMMs only:\n", static_cast<long long>(tokens),
              static_cast<long long>(kLayers), lm_head ? " + lm_head over every token" : "");
  for (size_t j = 0; j < per_layer.size(); ++j) {
    const double ms = (per_layer[j] * kLayers + head[j]) * 1e-3;
    std::printf("  %-12s %8.2f ms  -> at most %8.0f tok/s\n", kernel_name(Kernel(j)), ms, double(tokens) / ms * 1e3);
  }
  if (!ok) std::printf("\nVALIDATION FAILED (see the rows marked FAILED)\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_gemm: %s\n", e.what());
    return 1;
  }
}
