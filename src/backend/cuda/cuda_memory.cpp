// The caching device allocator (see cuda_memory.h).
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include "backend/cuda/cuda_memory.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "core/error.h"

namespace moecel::cuda {

DevicePool::~DevicePool() {
  // Errors are ignored: at process exit the CUDA runtime may already be unloaded.
  for (auto& [bucket, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
  cudaGetLastError();
}

size_t DevicePool::bucket_size(size_t bytes) {
  constexpr size_t kMin = 512, kPow2Max = size_t(4) << 20, kStep = size_t(2) << 20;
  if (bytes <= kMin) return kMin;
  if (bytes <= kPow2Max) {
    size_t b = kMin;
    while (b < bytes) b <<= 1;
    return b;
  }
  return (bytes + kStep - 1) / kStep * kStep;
}

std::shared_ptr<void> DevicePool::get(size_t bytes) {
  MOECEL_CHECK(bytes > 0, "cuda pool: zero-byte request");
  const size_t bucket = bucket_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bucket);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= bucket;
    }
  }
  if (!p) p = device_malloc(bucket, this, "an activation tensor");
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ += bucket;
  }
  std::shared_ptr<DevicePool> self = shared_from_this();
  return std::shared_ptr<void>(p, [self, bucket](void* q) { self->put(q, bucket); });
}

void DevicePool::put(void* p, size_t bucket) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[bucket].push_back(p);
  cached_ += bucket;
  live_ -= bucket;
}

void DevicePool::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [bucket, blocks] : free_) {
    for (void* p : blocks) cudaFree(p);
    blocks.clear();
  }
  cached_ = 0;
  cudaGetLastError();
}

size_t DevicePool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

size_t DevicePool::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

void* device_malloc(size_t bytes, DevicePool* pool, const char* what) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation && pool) {
    cudaGetLastError();  // not sticky, but it would be reported by the next launch check
    pool->release_cached();
    err = cudaMalloc(&p, bytes);
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    fail("CUDA backend: out of device memory allocating {} bytes for {} ({} MiB free of {} MiB)", bytes, what,
         free_b >> 20, total_b >> 20);
  }
  CUDA_CHECK(err);
  return p;
}

}  // namespace moecel::cuda
#endif  // MOECEL_HAVE_CUDA
