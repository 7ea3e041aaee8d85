// Tests of detail::run_parts (backend/cpu/matmul_internal.h), which hands out the matrix-vector rows: every
// item exactly once, pieces a multiple of the grain, the same pieces whichever thread runs them, nested calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "backend/cpu/matmul_internal.h"
#include "core/thread_pool.h"

namespace moecel {
namespace {

using Pieces = std::set<std::pair<int64_t, int64_t>>;

// Runs run_parts over n items and checks coverage; returns the pieces it called.
Pieces covered_once(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mu;
  Pieces pieces;
  cpu::detail::run_parts(n, grain, [&](int64_t b, int64_t e) {
    EXPECT_LT(b, e);
    EXPECT_EQ(b % grain, 0) << "piece [" << b << ", " << e << ")";
    EXPECT_TRUE(e == n || (e - b) % grain == 0) << "piece [" << b << ", " << e << ")";
    for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    pieces.emplace(b, e);
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "item " << i << " of " << n;
  return pieces;
}

TEST(CpuRunParts, EveryItemOnceInWholePieces) {
  const int saved = num_threads();
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    for (int64_t grain : {1, 4, 32})
      for (int64_t n : {0, 1, 5, 31, 32, 33, 1000, 50304}) {
        SCOPED_TRACE(testing::Message() << "threads " << threads << " grain " << grain << " n " << n);
        Pieces first = covered_once(n, grain);
        // The same pieces on a rerun, whichever thread took which.
        for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(covered_once(n, grain), first);
      }
  }
  set_num_threads(saved);
}

TEST(CpuRunParts, UnevenPiecesAreStolenNotLost) {
  // One part's pieces take far longer than the other's: the idle thread takes them from the back.
  const int saved = num_threads();
  set_num_threads(2);
  const int64_t n = 64;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  cpu::detail::run_parts(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i < n / 2) {
        volatile double s = 0;
        for (int k = 0; k < 20000; ++k) s = s + k;
      }
      hits[size_t(i)].fetch_add(1);
    }
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "item " << i;
  set_num_threads(saved);
}

TEST(CpuRunParts, NestedInsideParallelForRunsEverything) {
  const int saved = num_threads();
  set_num_threads(2);
  std::vector<std::atomic<int>> hits(4 * 100);
  parallel_for(4, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      cpu::detail::run_parts(100, 8, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(t * 100 + i)].fetch_add(1);
      });
  });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << "item " << i;
  set_num_threads(saved);
}

TEST(CpuRunParts, RejectsABadGrain) {
  EXPECT_ANY_THROW(cpu::detail::run_parts(10, 0, [](int64_t, int64_t) {}));
}

}  // namespace
}  // namespace moecel
