// The probe of measurement builds (cmake -DMOECEL_CUDA_PROBE=ON; MOECEL_CUDA_PROBE_OUT=file at run time): thread 0
// of every block records when it called pdl_wait() and when the wait returned (the kernel before had finished), plus
// up to four probe_mark(i) points, so a decode step's chain of kernels can be laid out in time
// (tools/probe_timeline.py). Included by cuda_common.cuh in those builds only; the host side is probe.cpp.
#pragma once
#include <cuda_runtime.h>

namespace moecel::cuda {

struct ProbeRecord {
  unsigned grid, block, smid, pad;
  unsigned long long t_call, t_return;
  unsigned long long mark[4];  // probe_mark(i): later points of the block (thread 0)
};
// Records per SM (rec[smid * cap + i], i < count[smid]): a block claims its slot with an atomic on its own SM's
// counter, so the claims before the waits of a launch's blocks do not all queue on one address.
constexpr int kProbeSms = 256;
struct ProbeBuffer {
  unsigned count[kProbeSms];
  unsigned cap, pad[3];
  ProbeRecord rec[1];
};
void probe_register(cudaError_t (*set)(ProbeBuffer*));
ProbeBuffer* probe_start(unsigned cap);
void probe_dump(ProbeBuffer* buffer, const char* path);

#ifdef __CUDACC__
// Each .cu file has its own copy of the pointer; the backend sets them all (probe_register).
static __device__ ProbeBuffer* probe_buffer;
static __shared__ ProbeRecord* probe_rec;  // this block's record (thread 0; null: none)
namespace {
cudaError_t probe_set(ProbeBuffer* p) {
  return cudaMemcpyToSymbol(probe_buffer, &p, sizeof p);
}
[[maybe_unused]] const bool probe_registered = (probe_register(probe_set), true);
}  // namespace

__device__ __forceinline__ unsigned long long probe_time() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned probe_smid() {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  return smid;
}

__device__ __forceinline__ bool probe_thread() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// pdl_wait()'s halves: everything but the two clock reads happens before the wait (or after the second), so the
// chain is not delayed. Returns the call time (thread 0; else 0) and claims the block's record.
__device__ __forceinline__ unsigned long long probe_wait_begin() {
  unsigned long long t0 = 0;
  if (probe_thread()) {
    ProbeBuffer* pb = probe_buffer;
    t0 = probe_time();
    probe_rec = nullptr;
    if (pb) {
      const unsigned sm = probe_smid() % kProbeSms, slot = atomicAdd(&pb->count[sm], 1u);
      if (slot < pb->cap) probe_rec = pb->rec + size_t(sm) * pb->cap + slot;
    }
  }
  return t0;
}

__device__ __forceinline__ void probe_wait_end(unsigned long long t0) {
  if (probe_thread()) {
    const unsigned long long t1 = probe_time();
    if (ProbeRecord* r = probe_rec) {
      r->grid = gridDim.x | gridDim.y << 16;
      r->block = blockIdx.x | blockIdx.y << 16;
      r->smid = probe_smid();
      r->t_call = t0;
      r->t_return = t1;
    }
  }
}

__device__ __forceinline__ void probe_mark_at(int i, unsigned long long t) {
  if (probe_thread()) {
    if (ProbeRecord* r = probe_rec) r->mark[i] = t;
  }
}

// Point i as the latest over the lanes 0 that call it (the record's marks start at zero).
__device__ __forceinline__ void probe_mark_max_now(int i) {
  if ((threadIdx.x & 31) == 0) {
    if (ProbeRecord* r = probe_rec) atomicMax(&r->mark[i], probe_time());
  }
}

__device__ __forceinline__ void probe_mark_now(int i) {
  if (probe_thread()) {
    const unsigned long long t = probe_time();
    if (ProbeRecord* r = probe_rec) r->mark[i] = t;
  }
}
#endif  // __CUDACC__

}  // namespace moecel::cuda
