// Internals of CudaBackend shared by its .cpp files (host compiler only): the backend's state (Impl), the host-side
// checks every op runs before a launch, and the environment knobs.
// Used by: cuda_backend.cpp (setup, memory, graphs, plain ops), cuda_backend_decode.cpp (decode fusions, fused
// MoE, argmax, family ops), cuda_checks.cpp (the checks).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/qmatmul.cuh"
#include "backend/op_checks.h"
#include "core/error.h"

namespace moecel {
namespace cuda_host {

// The float type of a weight / norm tensor, or an error naming `what`.
cuda::FloatType float_type(DType t, const std::string& what);
// The tensor is on the device (and has data unless empty).
void check_dev(const Tensor& t, const char* what);
// ... and is F32.
void check_f32(const Tensor& t, const char* what);
// Kernels that stage inputs in shared memory must not write their own input.
void check_no_overlap(const Tensor& a, const Tensor& b, const char* what);
// A device weight, checked (check_linear_weight) and turned into raw pointers.
cuda::WeightView weight_view(const LinearWeight& w, const char* op);
// An integer environment knob: `fallback` when unset, else one of `allowed` (anything else is an error naming it).
int knob_from_env(const char* name, int fallback, std::initializer_list<int> allowed);

}  // namespace cuda_host

// Host <-> device words of a decode-graph replay (pinned, so the async copies read / write them directly).
struct StepIo {
  int64_t pos;
  int32_t id, next;
};

// Impl::route_dev: the route's words (up to 65) from 0, its slots (up to 16) from kRouteSlotsAt.
constexpr int kRouteWords = 128, kRouteSlotsAt = 96;

struct CudaBackend::Impl {
  cuda::Ctx ctx;
  uint64_t glu_launch = ~uint64_t(0);  // ctx.launches after the last gather glu kernel, and its indices
  const int32_t* glu_indices = nullptr;
  // Launch-width knobs of the fused path, read once per backend (results do not depend on them):
  // MOECEL_CUDA_FUSED_ROWS (rows per warp of kernel A: 1, 2, 4; 0 = the pipelined grid-stride kernel A),
  // MOECEL_CUDA_FUSED_DOWN_ROWS (kernel B: 1, 2) and MOECEL_CUDA_FUSED_SLOTS (slots kernel B stages at once).
  int fused_rows_per_warp = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_ROWS", 2, {0, 1, 2, 4});
  int fused_down_rows_per_warp = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_DOWN_ROWS", 1, {1, 2});
  int fused_slot_batch = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_SLOTS", 4, {1, 2, 4, 8});
  // Decode-step fusions (bit 1: rms_norm_linears, 2: linear_residual, 4: rms_norm_router's norm, 8: its top-k in
  // the same launch, 16: qk_norm_rope_attention in one launch); for measuring what each saves. Results do not
  // depend on them.
  int fusions = cuda_host::knob_from_env("MOECEL_CUDA_FUSIONS", 23,
                                         {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                          16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31});
  // A greedy step's argmax in the last block of its vocabulary projection (rms_norm_linear_argmax;
  // MOECEL_CUDA_ARGMAX_TAIL=0: a launch of its own). The same ids either way.
  bool argmax_tail = cuda_host::knob_from_env("MOECEL_CUDA_ARGMAX_TAIL", 1, {0, 1}) == 1;
  // The post-attention router's product computed by the o projection's blocks, summed by the top-k launch
  // (CudaBackend::linear_residual_norm_router): one launch fewer per MoE layer. Its logits round differently from
  // rms_norm_router's (the norm's factor applied after the sum), hence a knob of its own.
  bool router_share = cuda_host::knob_from_env("MOECEL_CUDA_ROUTER_SHARE", 1, {0, 1}) == 1;
  bool fused_b_prefetch = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_B_PREFETCH", 1, {0, 1}) == 1;
  // Kernels A and B fed by bulk copies where they apply (MOECEL_CUDA_FUSED_BULK=0: the register-prefetch kernels).
  bool fused_bulk = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_BULK", 1, {0, 1}) == 1;
  // The bulk kernels A and B on tensor cores (MOECEL_CUDA_FUSED_MMA: 1 where measured faster, 2 wherever they apply,
  // 0 never: CUDA cores, bit for bit the gather path).
  int fused_mma = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_MMA", 1, {0, 1, 2});
  // The tensor-core kernel A requests kernel B's down rows into L2 (FusedMoeArgs::l2_down;
  // MOECEL_CUDA_FUSED_L2_DOWN=1), off by default: kernel A's tail is bound by DRAM, which the requests share
  // (docs/benchmarks.md, 37th tree).
  bool fused_l2_down = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_L2_DOWN", 0, {0, 1}) == 1;
  // The tensor-core kernels' conflict-free group loads (FusedMoeArgs::rotate; MOECEL_CUDA_FUSED_ROTATE).
  bool fused_rotate = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_ROTATE", 1, {0, 1}) == 1;
  // The tensor-core kernels' int8 operand (FusedMoeArgs::imma; MOECEL_CUDA_FUSED_IMMA).
  bool fused_imma = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_IMMA", 1, {0, 1}) == 1;
  // Kernels A and B sized to their blocks per SM (FusedMoeArgs::smem_fill; MOECEL_CUDA_FUSED_SMEM_FILL).
  bool fused_smem_fill = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_SMEM_FILL", 1, {0, 1}) == 1;
  // The router ranked inside kernels A and B (CudaBackend::linear_residual_router_fused_moe_add;
  // MOECEL_CUDA_FUSED_ROUTE=1). Off by default until this form has run on a GPU: an earlier build of it measured
  // ~+1.2% on an H100 (docs/benchmarks.md, forty-ninth session). Its weights round differently.
  bool fused_route = cuda_host::knob_from_env("MOECEL_CUDA_FUSED_ROUTE", 0, {0, 1}) == 1;
  // Its words and slots (cuda::RouteWords): zeroed here, then by each routed layer's kernel B.
  unsigned long long* route_dev = nullptr;
  std::shared_ptr<cuda::DevicePool> pool = std::make_shared<cuda::DevicePool>();
  unsigned* flag_host = nullptr;    // mapped pinned words the kernels raise DeviceError bits in (one per bit)
  int64_t* step_pos_dev = nullptr;  // the device step position decode graphs read (ctx.step_pos while recording)
  unsigned* counter_dev = nullptr;  // ctx.block_counter
  StepIo* io_host = nullptr;        // pinned, one per decode graph slot (DecodeGraph::launch)
  // Mapped pinned words (cuda::kNextWords) a decode graph's argmax writes its id to, by its step position modulo
  // their count.
  int32_t* next_host = nullptr;
  int32_t* next_mapped = nullptr;  // their device address
  bool capturing = false;
  int graph_steps = 0;  // argmaxes of the decode graph being recorded that increment step_pos_dev (argmax_to)
  // The value step_pos_dev will hold once the work enqueued so far has run (-1: not known).
  int64_t step_pos_next = -1;
  std::vector<std::shared_ptr<void>> captured;  // blocks handed out while recording: reserved for the graph

#if defined(MOECEL_CUDA_PROBE)
  cuda::ProbeBuffer* probe = nullptr;
#endif

  ~Impl() {  // errors ignored: this may run while the process exits
#if defined(MOECEL_CUDA_PROBE)
    if (probe) cuda::probe_dump(probe, std::getenv("MOECEL_CUDA_PROBE_OUT"));
#endif
    if (ctx.stream) {
      cudaStreamSynchronize(ctx.stream);
      cudaStreamDestroy(ctx.stream);
    }
    if (flag_host) cudaFreeHost(flag_host);
    if (io_host) cudaFreeHost(io_host);
    if (next_host) cudaFreeHost(next_host);
    if (step_pos_dev) cudaFree(step_pos_dev);
    if (counter_dev) cudaFree(counter_dev);
    if (route_dev) cudaFree(route_dev);
    cudaGetLastError();
  }

  void sync() {
    MOECEL_CHECK(!capturing, "CUDA backend: an op waited for the device while a decode graph was being recorded");
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    check_flag();
  }

  // Reports (and clears) bad input the kernels flagged up to the point the host has waited for.
  void check_flag() {
    unsigned e = 0;
    for (int i = 0; i < cuda::kDeviceErrorWords; ++i) {
      if (__atomic_exchange_n(flag_host + i, 0u, __ATOMIC_SEQ_CST)) e |= 1u << i;
    }
    if (e == 0) return;
    std::string what;
    if (e & cuda::kErrTokenId) what += "a token id outside the vocabulary (embedding)";
    if (e & cuda::kErrExpertIndex)
      what += std::string(what.empty() ? "" : "; ") + "an expert index outside [0, n_experts) (gather_linear)";
    fail("CUDA backend: a kernel was given bad input: {}; the affected outputs are NaN", what);
  }

  // Every device block of an op goes through here: while recording, the graph keeps it.
  std::shared_ptr<void> get(size_t bytes) {
    std::shared_ptr<void> p = pool->get(bytes);
    if (capturing) captured.push_back(p);
    return p;
  }
  std::shared_ptr<void> scratch(size_t bytes) {
    return get(std::max<size_t>(bytes, 16));
  }
};

}  // namespace moecel
