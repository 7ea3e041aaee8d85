// A small fixed thread pool for CPU kernels: parallel_for splits [0, n) into contiguous chunks.
// One process-wide pool; its size is set once from --threads (default: hardware concurrency).
#pragma once
#include <cstdint>
#include <functional>

namespace moecel {

// Sets the number of threads (>= 1) used by parallel_for. Call before the first parallel_for.
void set_num_threads(int n);
int num_threads();

// Calls fn(begin, end) on disjoint chunks covering [0, n), in parallel; returns when all are done.
// Chunks are multiples of `grain` (except the last). Nested calls run serially.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace moecel
