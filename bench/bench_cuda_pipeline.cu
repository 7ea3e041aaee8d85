// Whether a persistent decode kernel could beat the chain of PDL launches: a model of OLMoE-1B-7B's decode layers
// (4-bit g64 bytes per phase) run two ways over the same stand-in weights (a fresh region per layer,
// so nothing is served from L2 across layers; ~605 MB):
//   pdl      one kernel per phase in a CUDA graph, as the decode step runs today: each block bulk-copies its share
//            of the phase's weights into shared memory before its pdl_wait (after it, for the phases whose rows
//            depend on the router), stages the vector the phase before wrote, consumes its weights, writes a slice;
//   stream   one persistent kernel, one block per SM: a loader warp streams every phase's weight shares through a
//            ring of shared-memory slots in phase order, as far ahead as the ring allows (the experts' rows only
//            once the router phase is done everywhere); eight compute warps wait for the phase before through a
//            counter (release/acquire), stage the vector, consume the slots, write their slice and count in.
// Both consume each 16 bytes of weights with `--work` dependent FMAs per thread (kernel A's tensor-core loop is
// ~48 instructions per 16 bytes of weights). Prints microseconds per layer for each. Built only with the CUDA backend.
// --merge 1 models kernels A and B as one launch: the expert phase streams all 28.3 MB after the router (split along
// the experts' intermediate dimension, so no block waits for another), and with --atomics 1 every block then adds its
// partial output vector into 64-bit words with red.global.add (a fixed-point reduction needs no ordering). --chunked 1
// gives each of a pdl block's 32 KB copies its own barrier, consumed as it lands; --ring R (2-8) has the expert phases'
// blocks cycle their copies through R slots of 32 KB, so that the next phase's blocks fit beside them; --b-early 1
// has kernel B's blocks copy their rows before their wait, as the real kernel B does (by default, after it);
// --no-router 1 leaves the router phase out (a bound for folding it into another launch at no cost).
// Usage: bench_cuda_pipeline [--layers N] [--reps N] [--work N] [--slots N] [--merge 0|1] [--atomics 0|1]
//        [--chunked 0|1] [--ring R] [--b-early 0|1] [--no-router 0|1]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/bulk_copy.cuh"
#include "cuda_bench_util.cuh"

namespace {

using namespace moecel::cuda;

constexpr int kH = 2048;           // the vector every phase reads and writes
constexpr int kPhases = 6;         // q/k/v, attention, o + router shares, router top-k, kernel A, kernel B
constexpr int kRouter = 3;         // the phase whose output the expert phases' addresses depend on
constexpr int kCompute = 256;      // compute threads per block (8 warps)
constexpr int kChunk = 32 * 1024;  // bytes per ring slot (stream) and per copy (pdl)
constexpr int kMaxSlots = 7;
constexpr int kMaxChunks = 8;  // 32 KB copies of one block's share (pdl, --chunked 1)
// Bytes of each phase's weights (4-bit, group 64, f16 scales and biases: 4.5 bits per weight).
constexpr double kPhaseMB[kPhases] = {7.08, 0.0, 2.43, 0.0, 18.87, 9.44};
// The phases whose rows are known only once the router phase is done (kernels A and B).
__host__ __device__ constexpr bool dependent(int ph) {
  return ph == 4 || ph == 5;
}

struct Layout {
  const unsigned char* w = nullptr;  // all layers' weights
  int64_t per_block[kPhases] = {};   // bytes of a block's share (a multiple of 16)
  int64_t phase_off[kPhases] = {};   // offset of a phase within a layer
  int64_t layer_bytes = 0;
  float* vec = nullptr;      // (layers * kPhases + 1, kH): phase g reads vector g, writes g + 1
  unsigned* done = nullptr;  // (layers * kPhases): blocks finished with phase g (stream), grows by grid per rep
  unsigned* sink = nullptr;  // keeps the consumed words alive
  unsigned long long* words = nullptr;  // (kH): the merged expert phase's fixed-point sums (--atomics)
  int layers = 0, work = 0, slots = 0, atomics = 0, chunked = 0, ring = 0, b_early = 0;
};

// Bytes of the chunk at offset o of a share of `bytes`.
__device__ __forceinline__ unsigned chunk_bytes(int64_t bytes, int64_t o) {
  return unsigned(bytes - o < kChunk ? bytes - o : kChunk);
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Named barrier over the compute warps only (the stream kernel's loader warp never joins).
__device__ __forceinline__ void compute_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kCompute) : "memory");
}

// The norm factor 1 / rms(x) of vector x, from the block's sum of squares (kCompute threads; red: kCompute / 32
// floats).
template <bool kNamed>
__device__ __forceinline__ float stage_vector(const float* x, float* red) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < kH; i += kCompute) {
    const float v = __ldcg(x + i);
    s = fmaf(v, v, s);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = s;
  kNamed ? compute_sync() : __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kCompute / 32; ++i) total += red[i];
  return rsqrtf(total / kH + 1e-5f);
}

// `bytes` of weights in shared memory consumed by the compute threads: each 16 bytes feed `work` dependent FMAs.
__device__ __forceinline__ float consume(const unsigned char* p, int bytes, int work, float acc) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  for (int i = threadIdx.x; i < bytes / 16; i += kCompute) {
    const uint4 v = q[i];
    float a = __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3f7fffffu);
    for (int k = 0; k < work; ++k) acc = fmaf(acc, a, 1e-7f);
  }
  return acc;
}

__device__ __forceinline__ void write_slice(const float* x, float* y, float inv, float acc) {
  const int per = (kH + gridDim.x - 1) / gridDim.x;
  for (int i = threadIdx.x; i < per; i += kCompute) {
    const int j = blockIdx.x * per + i;
    if (j < kH) y[j] = __ldcg(x + j) * inv + (acc == 12345.0f ? 1.0f : 0.0f);
  }
}

// Shared memory of a pdl block of phase ph: its share, or with L.ring its ring of 32 KB slots (the expert phases).
inline int64_t phase_smem(const Layout& L, int ph) {
  const int64_t bytes = L.per_block[ph];
  return L.ring > 0 && dependent(ph) ? std::min<int64_t>(bytes, int64_t(L.ring) * kChunk) : bytes;
}

// One phase as its own launch (grid x kCompute threads, dynamic shared memory: phase_smem). With L.chunked each 32 KB
// copy has its own barrier and is consumed as it lands (kernel A's gate rows while up's arrive); with L.ring the
// expert phases cycle their copies through L.ring slots, a slot refilled once the block has consumed it, so that
// the next phase's blocks fit beside them.
__global__ void __launch_bounds__(kCompute) phase_kernel(Layout L, int layer, int ph) {
  extern __shared__ float4 smem4[];
  __shared__ uint64_t bar[kMaxChunks];
  __shared__ float red[kCompute / 32];
  unsigned char* tile = reinterpret_cast<unsigned char*>(smem4);
  const int64_t bytes = L.per_block[ph];
  const int n_chunks = int((bytes + kChunk - 1) / kChunk);
  const bool ring = L.ring > 0 && dependent(ph) && n_chunks > L.ring;
  const int n_bars = ring ? L.ring : L.chunked ? n_chunks : 1;
  const unsigned char* src = L.w + layer * L.layer_bytes + L.phase_off[ph] + blockIdx.x * bytes;
  if (threadIdx.x < n_bars) mbar_init(&bar[threadIdx.x], 1);
  __syncthreads();
  auto issue_chunk = [&](int c) {  // thread 0: chunk c into its slot
    const int64_t o = int64_t(c) * kChunk;
    uint64_t* b = &bar[ring ? c % L.ring : c];
    mbar_arrive_expect(b, chunk_bytes(bytes, o));
    bulk_copy(tile + (ring ? int64_t(c % L.ring) * kChunk : o), src + o, chunk_bytes(bytes, o), b);
  };
  auto issue = [&] {
    if (threadIdx.x != 0 || bytes == 0) return;
    if (ring) {
      for (int c = 0; c < L.ring; ++c) issue_chunk(c);
      return;
    }
    if (L.chunked) {
      for (int c = 0; c < n_chunks; ++c) issue_chunk(c);
      return;
    }
    mbar_arrive_expect(&bar[0], unsigned(bytes));
    for (int64_t o = 0; o < bytes; o += kChunk) bulk_copy(tile + o, src + o, chunk_bytes(bytes, o), &bar[0]);
  };
  // Kernel B's rows may go before its wait with L.b_early (as the real kernel B: the router ended two launches back).
  const bool late = dependent(ph) && !(L.b_early && ph == 5);
  if (!late) issue();
  pdl_wait();
  pdl_trigger();
  if (late) issue();
  const int g = layer * kPhases + ph;
  const float inv = stage_vector<false>(L.vec + int64_t(g) * kH, red);
  float acc = 0.0f;
  if (bytes > 0 && !L.chunked && !ring) {
    mbar_wait(&bar[0], 0);
    acc = consume(tile, int(bytes), L.work, acc);
  }
  for (int c = 0; (L.chunked || ring) && c < n_chunks; ++c) {
    const int64_t o = int64_t(c) * kChunk;
    if (ring) {
      mbar_wait(&bar[c % L.ring], unsigned((c / L.ring) & 1));
      acc = consume(tile + int64_t(c % L.ring) * kChunk, int(chunk_bytes(bytes, o)), L.work, acc);
      __syncthreads();  // the slot is free
      if (threadIdx.x == 0 && c + L.ring < n_chunks) issue_chunk(c + L.ring);
    } else {
      mbar_wait(&bar[c], 0);
      acc = consume(tile + o, int(chunk_bytes(bytes, o)), L.work, acc);
    }
  }
  write_slice(L.vec + int64_t(g) * kH, L.vec + int64_t(g + 1) * kH, inv, acc);
  if (L.atomics && ph == 4) {  // the merged expert phase's partial output, every element of it
    const long long q = __float2ll_rn(acc * 4294967296.0f);
    for (int i = threadIdx.x; i < kH; i += kCompute) atomicAdd(L.words + i, (unsigned long long)(q + i));
  }
  if (acc == 12345.0f) L.sink[0] = 1;
}

// All layers in one launch: warps 0-7 compute, warp 8's lane 0 loads. epoch: this launch's index from 1; phase g is
// complete everywhere once done[g] reaches epoch * gridDim.x.
__global__ void __launch_bounds__(kCompute + 32, 1) stream_kernel(Layout L, unsigned epoch) {
  extern __shared__ float4 smem4[];
  __shared__ uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ float red[kCompute / 32];
  unsigned char* ring = reinterpret_cast<unsigned char*>(smem4);
  const unsigned target = epoch * gridDim.x;
  const int S = L.slots;
  if (threadIdx.x < S) {
    mbar_init(&full[threadIdx.x], 1);
    mbar_init(&empty[threadIdx.x], kCompute / 32);
  }
  __syncthreads();
  if (threadIdx.x >= kCompute) {  // the loader
    if (threadIdx.x != kCompute) return;
    int64_t k = 0;  // chunks issued
    for (int layer = 0; layer < L.layers; ++layer) {
      for (int ph = 0; ph < kPhases; ++ph) {
        const int64_t bytes = L.per_block[ph];
        if (bytes == 0) continue;
        if (dependent(ph)) {
          while (ld_acquire(L.done + layer * kPhases + kRouter) < target) {
          }
        }
        const unsigned char* src = L.w + layer * L.layer_bytes + L.phase_off[ph] + blockIdx.x * bytes;
        for (int64_t o = 0; o < bytes; o += kChunk, ++k) {
          const int s = int(k % S);
          if (k >= S) mbar_wait(&empty[s], unsigned((k / S - 1) & 1));
          const unsigned n = chunk_bytes(bytes, o);
          mbar_arrive_expect(&full[s], n);
          bulk_copy(ring + int64_t(s) * kChunk, src + o, n, &full[s]);
        }
      }
    }
    return;
  }
  int64_t k = 0;  // chunks consumed
  float acc = 0.0f;
  for (int layer = 0; layer < L.layers; ++layer) {
    for (int ph = 0; ph < kPhases; ++ph) {
      const int g = layer * kPhases + ph;
      if (g > 0) {
        if (threadIdx.x == 0) {
          while (ld_acquire(L.done + g - 1) < target) {
          }
        }
        compute_sync();
      }
      const float inv = stage_vector<true>(L.vec + int64_t(g) * kH, red);
      const int64_t bytes = L.per_block[ph];
      for (int64_t o = 0; o < bytes; o += kChunk, ++k) {
        const int s = int(k % S);
        mbar_wait(&full[s], unsigned((k / S) & 1));
        acc = consume(ring + int64_t(s) * kChunk, int(chunk_bytes(bytes, o)), L.work, acc);
        __syncwarp();
        if ((threadIdx.x & 31) == 0)
          asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s])) : "memory");
      }
      write_slice(L.vec + int64_t(g) * kH, L.vec + int64_t(g + 1) * kH, inv, acc);
      compute_sync();  // every thread's slice is written
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(L.done + g, 1u);
      }
    }
  }
  if (acc == 12345.0f) L.sink[0] = 1;
}

}  // namespace

int main(int argc, char** argv) {
  Layout L;
  L.layers = moecel::bench::arg_int(argc, argv, "--layers", 16);
  const int reps = moecel::bench::arg_int(argc, argv, "--reps", 20);
  L.work = moecel::bench::arg_int(argc, argv, "--work", 48);
  L.slots = std::clamp(moecel::bench::arg_int(argc, argv, "--slots", 6), 2, kMaxSlots);
  const bool merge = moecel::bench::arg_int(argc, argv, "--merge", 0) != 0;
  const bool no_router = moecel::bench::arg_int(argc, argv, "--no-router", 0) != 0;
  L.atomics = merge && moecel::bench::arg_int(argc, argv, "--atomics", 0) != 0;
  L.chunked = moecel::bench::arg_int(argc, argv, "--chunked", 0) != 0;
  L.b_early = moecel::bench::arg_int(argc, argv, "--b-early", 0) != 0;
  L.ring = std::clamp(moecel::bench::arg_int(argc, argv, "--ring", 0), 0, kMaxChunks);
  double phase_mb[kPhases];
  std::copy(kPhaseMB, kPhaseMB + kPhases, phase_mb);
  if (merge) {  // kernel B's bytes move into kernel A's phase; phase 5 is not launched
    phase_mb[4] += phase_mb[5];
    phase_mb[5] = 0.0;
  }
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int ph = 0; ph < kPhases; ++ph) {
    L.per_block[ph] = (int64_t(phase_mb[ph] * 1e6 / sms) + 15) / 16 * 16;
    L.phase_off[ph] = L.layer_bytes;
    L.layer_bytes += L.per_block[ph] * sms;
  }
  if (L.ring == 1) L.ring = 2;
  int64_t max_share = 0;
  for (int ph = 0; ph < kPhases; ++ph) max_share = std::max(max_share, phase_smem(L, ph));
  if (L.chunked && max_share > int64_t(kMaxChunks) * kChunk) {
    std::printf("--chunked 1: a block's share (%lld bytes) needs more than %d barriers\n", (long long)max_share,
                kMaxChunks);
    return 1;
  }
  unsigned char* w;
  CUDA_CHECK(cudaMalloc(&w, size_t(L.layer_bytes) * L.layers));
  CUDA_CHECK(cudaMemset(w, 0x3c, size_t(L.layer_bytes) * L.layers));
  L.w = w;
  const int n_vec = L.layers * kPhases + 1;
  CUDA_CHECK(cudaMalloc(&L.vec, size_t(n_vec) * kH * 4));
  std::vector<float> ones(size_t(n_vec) * kH, 1.0f);
  CUDA_CHECK(cudaMemcpy(L.vec, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&L.done, size_t(n_vec) * 4));
  CUDA_CHECK(cudaMemset(L.done, 0, size_t(n_vec) * 4));
  CUDA_CHECK(cudaMalloc(&L.sink, 4));
  CUDA_CHECK(cudaMalloc(&L.words, size_t(kH) * 8));
  CUDA_CHECK(cudaMemset(L.words, 0, size_t(kH) * 8));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("%d SMs, %d layers of %.1f MB (%d phases), %d FMAs per 16 bytes, %d ring slots of %d KB%s%s\n", sms,
              L.layers, L.layer_bytes / 1e6, kPhases - (merge ? 1 : 0) - (no_router ? 1 : 0), L.work, L.slots,
              kChunk / 1024, merge ? ", experts in one phase" : "", L.atomics ? ", atomic sums" : "");

  // pdl: one kernel per phase, in a graph.
  CUDA_CHECK(cudaFuncSetAttribute(phase_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_share)));
  cudaGraph_t g;
  CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  Ctx ctx;
  ctx.stream = st;
  ctx.pdl = true;
  for (int layer = 0; layer < L.layers; ++layer) {
    for (int ph = 0; ph < kPhases; ++ph) {
      if ((merge && ph == 5) || (no_router && ph == kRouter)) continue;
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t cfg = launch_config(ctx, dim3(sms), dim3(kCompute), size_t(phase_smem(L, ph)), attr);
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, L, layer, ph));
    }
  }
  CUDA_CHECK(cudaStreamEndCapture(st, &g));
  const double pdl_us = moecel::bench::graph_replay_us(st, g, reps) / L.layers;
  std::printf("pdl     %8.2f us per layer (%.0f GB/s)\n", pdl_us, L.layer_bytes / pdl_us / 1e3);
  if (merge || no_router) return 0;  // the persistent model keeps six phases

  // stream: one persistent launch per rep.
  const size_t ring = size_t(L.slots) * kChunk;
  CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ring)));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_kernel, kCompute + 32, ring));
  if (per_sm < 1) {
    std::printf("stream: the kernel does not fit an SM with %d slots\n", L.slots);
    return 1;
  }
  unsigned epoch = 0;  // launches so far: each one's counters target (epoch) * grid
  const double stream_us =
      moecel::bench::launches_us(st, reps, [&] { stream_kernel<<<sms, kCompute + 32, ring, st>>>(L, ++epoch); }) /
      L.layers;
  float check = 0;
  CUDA_CHECK(cudaMemcpy(&check, L.vec + size_t(n_vec - 1) * kH, 4, cudaMemcpyDeviceToHost));
  std::printf("stream  %8.2f us per layer (%.0f GB/s; last vector[0] = %g)\n", stream_us,
              L.layer_bytes / stream_us / 1e3, check);
  return 0;
}
