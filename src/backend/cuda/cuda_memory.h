// Device memory of the CUDA backend: a caching allocator for activations and scratch (models allocate
// scratch tensors on every forward; cudaMalloc/cudaFree there would synchronize the device each time) and
// plain allocations for weights, which live for the whole run.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace moecel::cuda {

// Size-bucketed free lists of device blocks. A block handed out is owned by the returned shared_ptr whose
// deleter puts it back on its free list; the deleter keeps the pool alive, so tensors may outlive the backend.
// Reuse is safe without events because the backend runs all work on one stream: any later use of a recycled
// block is queued after the kernels that used it before.
class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  DevicePool() = default;
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A block of at least `bytes` (> 0) bytes, 256-byte aligned, contents undefined.
  std::shared_ptr<void> get(size_t bytes);
  // The bucket a request of `bytes` is served from: powers of two up to 4 MiB, then multiples of 2 MiB.
  static size_t bucket_size(size_t bytes);
  // Frees every cached block (called before giving up on an out-of-memory cudaMalloc).
  void release_cached();
  size_t cached_bytes() const;
  size_t live_bytes() const;

 private:
  void put(void* p, size_t bucket);

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0, live_ = 0;
};

// cudaMalloc that, on failure, empties `pool`'s cache and retries once; throws moecel::Error when out of memory.
void* device_malloc(size_t bytes, DevicePool* pool, const char* what);

}  // namespace moecel::cuda
