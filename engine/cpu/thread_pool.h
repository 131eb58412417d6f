// A persistent pool of worker threads for the CPU kernels (no thread is created per op).
// parallel_for may be called from any thread; concurrent calls are serialised by a mutex (one
// job runs at a time, using every worker), so sessions on different threads share one pool
// safely. The calling thread works too. Workers live as long as the pool.
// A decode step is a few hundred small jobs of ~10-50 µs each, so waking through a condition
// variable (~5-20 µs per wake) would cost as much as the work: workers and the caller spin on
// atomics for a while (kSpinIterations pauses, ~0.1-0.5 ms) before they block.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::engine {

class ThreadPool {
 public:
  // n_threads <= 0: std::thread::hardware_concurrency(). The caller counts as one thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into chunks of at least `grain` items.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();

  std::mutex submit_mu_;  // serialises whole jobs
  std::mutex mu_;         // guards the fields below
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;  // GUARDED_BY(mu_)
  uint64_t generation_ = 0;                                      // GUARDED_BY(mu_)
  std::atomic<uint64_t> published_{0};  // == generation_, readable without mu_ (spinning)
  std::atomic<int> active_{0};          // workers that have not finished the current job
  bool stop_ = false;                                            // GUARDED_BY(mu_)
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace kiln::engine
