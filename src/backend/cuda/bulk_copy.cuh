// Hopper bulk copies (cp.async.bulk, global -> shared) completed on shared-memory mbarriers: one instruction moves
// a contiguous, 16-byte aligned span of any multiple of 16 bytes, without registers or per-lane address arithmetic,
// so a block can put all of its weight bytes in flight at once.
// Used by: fused_moe_bulk.cu.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initializes; a __syncthreads must follow before any other thread uses the barrier.
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The calling thread's arrival, announcing `bytes` of bulk copies that complete on this barrier.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Waits until the barrier's phase `parity` has completed (all arrivals and all announced bytes).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// dst (shared) <- src (global), `bytes` a multiple of 16, both 16-byte aligned; completes on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// bulk_copy of weights, which a decode step reads once: marked to leave L2 first, so that the step's streams of
// weights do not evict what is read again (code, activations, the KV cache).
__device__ __forceinline__ void bulk_copy_once(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// Requests `bytes` (a multiple of 16) from src (16-byte aligned) into L2, without a destination or a completion.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

}  // namespace moecel::cuda
