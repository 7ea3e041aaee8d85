// Persistent worker threads. Workers spin briefly before sleeping because a decode step issues
// hundreds of short parallel_for calls and a condition-variable wake-up per call would dominate.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace moecel {
namespace {

class Pool {
 public:
  explicit Pool(int n) : n_threads_(n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_threads_; }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    int64_t chunks = (n + grain - 1) / grain;
    int used = int(std::min<int64_t>(n_threads_, chunks));
    if (used <= 1 || in_parallel_) {
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    Job job{&fn, n, grain, used};
    {
      // Workers copy the job under this lock, so a late worker never mixes two jobs.
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      pending_.store(used - 1, std::memory_order_relaxed);
      ++generation_;
    }
    cv_.notify_all();
    in_parallel_ = true;
    run_part(job, 0);
    in_parallel_ = false;
    while (pending_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, grain = 1;
    int used = 0;
  };

  static void run_part(const Job& job, int part) {
    int64_t chunks = (job.n + job.grain - 1) / job.grain;
    int64_t c0 = chunks * part / job.used, c1 = chunks * (part + 1) / job.used;
    int64_t b = c0 * job.grain, e = std::min(job.n, c1 * job.grain);
    if (b < e) (*job.fn)(b, e);
  }

  void worker(int index) {
    uint64_t seen = 0;
    for (;;) {
      // Spin for a while (cheap wake-up during a decode step), then sleep.
      bool woke = false;
      for (int spin = 0; spin < 20000; ++spin) {
        if (generation_.load(std::memory_order_acquire) != seen) {
          woke = true;
          break;
        }
        std::this_thread::yield();
      }
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!woke) cv_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        if (stop_) return;
        job = job_;
      }
      if (index < job.used) {
        in_parallel_ = true;
        run_part(job, index);
        in_parallel_ = false;
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  Job job_;
  static thread_local bool in_parallel_;
};

thread_local bool Pool::in_parallel_ = false;

int g_requested = 0;
std::unique_ptr<Pool>& pool_slot() {
  static std::unique_ptr<Pool> p;
  return p;
}
std::mutex g_pool_mu;

Pool& pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  auto& p = pool_slot();
  if (!p) {
    int n = g_requested > 0 ? g_requested : int(std::max(1u, std::thread::hardware_concurrency()));
    p = std::make_unique<Pool>(n);
  }
  return *p;
}

}  // namespace

void set_num_threads(int n) {
  MOECEL_CHECK(n >= 1 && n <= 1024, "--threads must be between 1 and 1024, got {}", n);
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_requested = n;
  auto& p = pool_slot();
  if (p && p->size() != n) p.reset();
}

int num_threads() {
  return pool().size();
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  pool().run(n, std::max<int64_t>(1, grain), fn);
}

}  // namespace moecel
