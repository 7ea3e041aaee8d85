// Shared plumbing of the CUDA backend: checks that turn CUDA errors and broken launch preconditions into
// moecel::Error, the context every launcher receives (stream, device limits, device-side error flag), and
// small device helpers (float loads of F32/F16/BF16 data, warp reductions).
// Included by the kernels (.cu) and by the host-only .cpp files of the backend, which never see device code.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#if defined(MOECEL_CUDA_PROBE)
#include "backend/cuda/probe.cuh"  // measurement builds only
#endif

namespace moecel::cuda {

// Throw moecel::Error naming the failed call / condition and where it was checked (defined in cuda_common.cpp,
// compiled by the host compiler: fmt's compile-time format strings do not build under nvcc).
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_precondition(const char* cond, const std::string& what, const char* file, int line);

// The float types a weight, scale or norm weight may have on the device (mirrors DType's float members).
enum class FloatType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bits kernels raise in the error flag on bad input that only the device sees (indices computed on the GPU).
// The backend reads the flag after every synchronization and throws. The flag is one mapped host word per bit
// (word i for bit 1 << i), each set by a plain store: a system-scope atomic on mapped host memory is not supported
// over PCIe (compute-sanitizer rejects it), and every writer of a word stores the same 1.
enum DeviceError : unsigned {
  kErrTokenId = 1u,      // embedding: a token id outside [0, vocab_size)
  kErrExpertIndex = 2u,  // gather_linear: an expert index outside [0, n_experts)
};
constexpr int kDeviceErrorWords = 2;
static_assert(kErrExpertIndex < (1u << kDeviceErrorWords), "a flag word for every DeviceError bit");

// What every launcher needs. All work of a backend goes to its one stream.
struct Ctx {
  cudaStream_t stream = nullptr;
  unsigned* error_flag = nullptr;  // device pointer to kDeviceErrorWords mapped, pinned host words (see DeviceError)
  int sm_count = 0;
  int max_smem_optin = 48 * 1024;  // bytes of dynamic shared memory one block may opt into
  int smem_per_sm = 0;  // bytes of shared memory of one SM, and what each resident block takes beyond its own
  int smem_reserved = 0;
  // Set while a decode graph is recorded: rope, kv_store and attention read their pos0 from this device word
  // (written before each replay) instead of the value passed at record time.
  const int64_t* step_pos = nullptr;
  // Programmatic dependent launch for the kernels launched with launch_k (MOECEL_CUDA_PDL=0 turns it off).
  bool pdl = true;
  // Rows per warp of the matrix-vector kernel (MOECEL_CUDA_GEMV_ROWS: 1, 2 or 4; 0 = chosen by size).
  int gemv_rows = 0;
  // Rows per warp of the bulk-copy matrix-vector kernel for a normalized decode x (gemv_bulk.cu), the one-token
  // rms_norm_linears (q, k, v) with 4-/8-bit weights; 0 = off (MOECEL_CUDA_GEMV_BULK: 0, 2 or 4).
  int gemv_bulk = 2;
  // That product on int8 tensor cores (gemv_bulk_imma.cu), in blocks of this many 16-row tiles; 0 = the CUDA-core
  // sums (MOECEL_CUDA_GEMV_IMMA: 0, 1 or 2).
  int gemv_imma = 1;
  // The one-token output projection (y = residual + x @ w^T, the router's share) on int8 tensor cores
  // (gemv_bulk_imma.cu; MOECEL_CUDA_GEMV_RESIDUAL_IMMA: 0 or 1).
  int gemv_residual_imma = 1;
  // The same kernel for the gather path's expert products (MOECEL_CUDA_GEMV_BULK_GATHER: 0, 2 or 4).
  int gemv_bulk_gather = 4;
  // The same kernel for the gather path's decode gate + up with the activation in its epilogue (rows per warp:
  // half of them gate's, half up's; MOECEL_CUDA_GEMV_BULK_GLU: 0 = off, the products then the glu launch).
  int gemv_bulk_glu = 4;
  // Barriers the gather path's bulk gate + up (and down) products split each block's row copies over, in the warps'
  // order, so the first warps start on their rows while the rest arrive (MOECEL_CUDA_GEMV_STAGES, _STAGES_DOWN: 1, 2,
  // 4 or 8).
  int gemv_stages = 2;
  int gemv_down_stages = 2;
  // Of those, how many are in flight at once (MOECEL_CUDA_GEMV_DEPTH): the next goes out as the earliest lands.
  int gemv_depth = 1;
  // Earlier starts in the decode chain (MOECEL_CUDA_PDL_EARLY bits, default 6): 1 kernel B of the fused path and 2 the
  // gather path's weighted sum let the next kernel (the next layer's q/k/v, which reads only weights before its
  // wait) launch as they start, so its weight copies go out while they run (1 measured slower); 4 the gather path's
  // down product reads its experts and issues its weight copies before its wait when it directly follows the gather
  // glu kernel of the same indices (PairMap::indices_final).
  int pdl_early = 6;
  // The router reduction's shares, y and sums of squares moved into shared memory by bulk copies after its wait
  // (MOECEL_CUDA_ROUTER_BULK; 0: per-thread loads).
  bool router_bulk = true;
  // The router reduction specialized for its exact shape where it has one (MOECEL_CUDA_ROUTER_EXACT; the same sums).
  bool router_exact = true;
  // Ring stages per warp of the tensor-core matrix-vector kernel (the lm_head; MOECEL_CUDA_MMA_STAGES: 2, 3 or 4):
  // fewer stages, more resident blocks.
  int mma_stages = 2;
  // The decode attention blocks request up to this many of their latest cache rows into L2 before their wait
  // (MOECEL_CUDA_KV_PREFETCH; 0: none).
  int kv_prefetch_rows = 1024;
  // Launches so far (launch_k): lets the backend know which kernel a launch directly follows.
  mutable uint64_t launches = 0;
  int extra_launches = 0;  // MOECEL_CUDA_EXTRA_LAUNCHES (measurement only)
  // MOECEL_CUDA_SKIP (measurement only): kernels to replace by an empty one, "name[:grid_x],...", to measure what
  // each costs a decode step (their outputs keep the previous step's values).
  const char* skip = nullptr;
  // Tensor-core matrix-vector kernels for 4-/8-bit weights (gemv_mma.cuh), MOECEL_CUDA_DECODE_MMA:
  // 0 never, 1 for every eligible weight, 2 (default) only for single matrices of at least kMmaAutoRows rows
  // (the lm_head), where they are measured faster.
  int decode_mma = 2;
  // Ring slots of the streaming matrix-vector kernel for one token of a large product (gemv_stream.cu: the lm_head);
  // 0 = off (MOECEL_CUDA_GEMV_STREAM: 0, 2, 3, 4 or 5).
  int gemv_stream = 2;
  // Its tensor-core variant where the shape allows (MOECEL_CUDA_GEMV_STREAM_MMA: 1 x as the int8 operand, 2 as bf16
  // planes; 0: CUDA-core sums, bit for bit the other matrix-vector kernels').
  int gemv_stream_mma = 1;
  // A zeroed device counter for kernels that finish with a "last block" epilogue (each resets it on exit).
  unsigned* block_counter = nullptr;
};

// Decode graphs' mapped host words for the argmax ids: two replays of two steps in flight write four consecutive
// positions' words (misc.cuh, launch_argmax).
constexpr int kNextWords = 4;

}  // namespace moecel::cuda

// Every CUDA runtime call is wrapped; launches are followed by CUDA_CHECK_LAUNCH().
#define CUDA_CHECK(expr)                                                                                      \
  do {                                                                                                        \
    cudaError_t moecel_err_ = (expr);                                                                         \
    if (moecel_err_ != cudaSuccess) ::moecel::cuda::throw_cuda_error(moecel_err_, #expr, __FILE__, __LINE__); \
  } while (0)
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
// Launch preconditions in .cu files (the host .cpp files use MOECEL_CHECK with formatted messages).
#define CUDA_REQUIRE(cond, what)                                                        \
  do {                                                                                  \
    if (!(cond)) ::moecel::cuda::throw_precondition(#cond, (what), __FILE__, __LINE__); \
  } while (0)

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

namespace moecel::cuda {

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Element i of F32/F16/BF16 data chosen at run time (for kernels where the dtype is not a template argument).
__device__ __forceinline__ float load_float(const void* p, FloatType t, int64_t i) {
  switch (t) {
    case FloatType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case FloatType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. Preconditions: blockDim.x is a multiple of 32 and at most
// 1024; every thread calls it; `red` holds 32 floats. Ends with a barrier, so `red` may be reused right away.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? red[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

// Max over the block, returned to every thread (same preconditions as block_sum).
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? red[lane] : -INFINITY;
  t = warp_max(t);
  __syncthreads();
  return t;
}

// (value, index) pairs: a larger value wins; the lower index wins a tie; index -1 means "none".
__device__ __forceinline__ bool arg_better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (arg_better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Argmax over the block (ties to the lower index), returned to every thread. Same preconditions as block_sum;
// `red_v` and `red_i` hold 32 entries each.
__device__ __forceinline__ void block_argmax(float& v, int& i, float* red_v, int* red_i) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  warp_argmax(v, i);
  if (lane == 0) {
    red_v[warp] = v;
    red_i[warp] = i;
  }
  __syncthreads();
  float tv = lane < n_warps ? red_v[lane] : 0.0f;
  int ti = lane < n_warps ? red_i[lane] : -1;
  warp_argmax(tv, ti);
  __syncthreads();
  v = tv;
  i = ti;
}

// The argmax of n (value, index) partials other blocks wrote (read through L2), every thread's share in increasing
// order, then block_argmax: the result in every thread, ties to the lower index.
__device__ __forceinline__ void block_argmax_partials(const float* part_v, const int* part_i, int n, float* red_v,
                                                      int* red_i, float& v, int& i) {
  v = 0.0f;
  i = -1;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float pv = __ldcg(part_v + j);
    const int pi = __ldcg(part_i + j);
    if (arg_better(pv, pi, v, i)) {
      v = pv;
      i = pi;
    }
  }
  block_argmax(v, i, red_v, red_i);
}

// Thread 0 of the block that found a greedy step's id: *out = id (0 where none was found); with advance, host word
// *advance % kNextWords also receives it and *advance (the decode graph's step position) moves on.
__device__ __forceinline__ void publish_argmax(int i, int32_t* out, int64_t* advance, int32_t* host_out) {
  const int32_t id = i < 0 ? 0 : i;
  *out = id;
  if (advance) {
    if (host_out) {
      host_out[*advance % kNextWords] = id;
      __threadfence_system();
    }
    *advance += 1;
  }
}

__device__ __forceinline__ void raise_device_error(unsigned* flag, unsigned bits) {
  if (!flag) return;
#pragma unroll
  for (int i = 0; i < kDeviceErrorWords; ++i) {
    if (bits & (1u << i)) *static_cast<volatile unsigned*>(flag + i) = 1u;
  }
}

// Programmatic dependent launch (PDL). A kernel launched by launch_k may start while the kernel before it on the
// stream is still running: before pdl_wait() it may only read weights (never written by kernels), so their
// memory latency overlaps the previous kernel; pdl_wait() returns once that kernel has finished and its writes
// are visible. pdl_trigger() (always after pdl_wait(), so at most two kernels overlap) lets the next one start.
// That order is also what lets a kernel read, before its wait, what the kernel two launches back wrote (kernel B
// reads the router's indices so): with pdl_enter() triggering first, decode results changed (docs/benchmarks.md,
// eighteenth session).
// Both are no-ops for a kernel launched without the attribute. In probe builds pdl_wait() also records when the
// block called it and when it returned (probe.cuh).

__device__ __forceinline__ void pdl_wait() {
#if defined(MOECEL_CUDA_PROBE)
  const unsigned long long t0 = probe_wait_begin();
#endif
  asm volatile("griddepcontrol.wait;" ::: "memory");
#if defined(MOECEL_CUDA_PROBE)
  probe_wait_end(t0);
#endif
}

// Thread 0 of a block records point i (0-3) of its progress after pdl_wait() (measurement builds; else nothing).
__device__ __forceinline__ void probe_mark(int i) {
#if defined(MOECEL_CUDA_PROBE)
  probe_mark_now(i);
#endif
}
// Point i of the last warp to reach it (lane 0 of every warp calls it; after a barrier that follows pdl_wait()).
__device__ __forceinline__ void probe_mark_max([[maybe_unused]] int i) {
#if defined(MOECEL_CUDA_PROBE)
  probe_mark_max_now(i);
#endif
}
// The clock at a kernel's entry (probe builds; else 0), recorded after pdl_wait() as point i by probe_entry_mark.
__device__ __forceinline__ unsigned long long probe_entry() {
#if defined(MOECEL_CUDA_PROBE)
  return probe_thread() ? probe_time() : 0;
#else
  return 0;
#endif
}
__device__ __forceinline__ void probe_entry_mark([[maybe_unused]] int i, [[maybe_unused]] unsigned long long t) {
#if defined(MOECEL_CUDA_PROBE)
  probe_mark_at(i, t);
#endif
}
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Both at once, for kernels with nothing to prefetch.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// An empty kernel: MOECEL_CUDA_EXTRA_LAUNCHES=n puts n of them before every launch_k kernel, to measure what one
// kernel boundary costs a decode step.
static __global__ void empty_kernel() {
  pdl_enter();
}

// A launch on the context's stream; `attr` receives the PDL attribute, which is used when ctx.pdl is set.
inline cudaLaunchConfig_t launch_config(const Ctx& ctx, dim3 grid, dim3 block, size_t smem, cudaLaunchAttribute& attr) {
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream;
  cfg.attrs = &attr;
  cfg.numAttrs = ctx.pdl ? 1 : 0;
  return cfg;
}

// Dynamic shared memory above which a launch opts in explicitly. Below 48 KiB: the limit without opting in
// covers static and dynamic shared memory together, and kernels have up to ~9 KiB of static shared memory.
constexpr size_t kSmemOptInAbove = 32 * 1024;

// Launches `kernel` on the context's stream, with programmatic stream serialization when ctx.pdl is set, opting
// into more than 48 KiB of dynamic shared memory when `smem` asks for it. Every kernel launched this way calls
// pdl_wait() before it touches memory that earlier kernels write.
// Whether MOECEL_CUDA_SKIP names this kernel (its mangled name contains an entry's name; grid.x equals its grid_x).
bool skip_launch(const char* spec, const void* kernel, dim3 grid);

template <class... KArgs, class... Args>
void launch_k(const Ctx& ctx, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  ++ctx.launches;
  if (ctx.skip && skip_launch(ctx.skip, reinterpret_cast<const void*>(kernel), grid)) {
    cudaLaunchAttribute ea;
    const cudaLaunchConfig_t ec = launch_config(ctx, dim3(1), dim3(32), 0, ea);
    CUDA_CHECK(cudaLaunchKernelEx(&ec, empty_kernel));
    return;
  }
  for (int i = 0; i < ctx.extra_launches; ++i) {
    cudaLaunchAttribute ea;
    const cudaLaunchConfig_t ec = launch_config(ctx, dim3(1), dim3(32), 0, ea);
    CUDA_CHECK(cudaLaunchKernelEx(&ec, empty_kernel));
  }
  if (smem > kSmemOptInAbove) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config(ctx, grid, block, smem, attr);
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) resident on one SM at once, asked
// once per (kernel, smem): launches outside a graph run on every decode step.
template <class Kernel>
int resident_per_sm(Kernel kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> known;
  const std::pair<const void*, size_t> key{reinterpret_cast<const void*>(kernel), smem};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  if (smem > kSmemOptInAbove) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  known[key] = std::max(n, 1);
  return known[key];
}

// `kernel`'s static shared memory in bytes (asked once per kernel): a request sized to fill an SM with N blocks must
// leave it room, or N - 1 fit (the probe build's 8 bytes cost kernel A a quarter of its resident blocks so).
template <class Kernel>
size_t static_smem_bytes(Kernel kernel) {
  static std::mutex mu;
  static std::map<const void*, size_t> known;
  const void* key = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  cudaFuncAttributes fa{};
  CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  return known[key] = fa.sharedSizeBytes;
}

}  // namespace moecel::cuda
#endif  // __CUDACC__
