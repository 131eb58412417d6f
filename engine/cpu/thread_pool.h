// A persistent pool of worker threads for the CPU kernels (no thread is created per op).
// parallel_for may be called from any thread; concurrent calls are serialised by a mutex (one
// job runs at a time, using every worker), so sessions on different threads share one pool
// safely. The calling thread works too. Workers live as long as the pool.
//
// A decode step is a few hundred small jobs of ~10-50 µs each, so waking through a condition
// variable (~5-20 µs per wake) would cost as much as the work: workers spin on an atomic for a
// while (kSpinIterations pauses, ~0.1-0.5 ms) before they block.
//
// Chunks are claimed with one compare-and-swap on a state word (job generation | chunk count |
// next chunk); they shrink towards the end of a job (guided scheduling) so the threads finish
// within about a grain of each other. The caller waits only for chunks that were claimed, never
// for a worker to check in: on a machine busy with other processes (builds run compilers next to the engine) a
// descheduled worker no longer stalls every section for a scheduler time slice — the caller
// simply runs the chunks itself. A worker reads the job after its claim succeeds; the job cannot
// finish (and be replaced) before its claimed chunk is done, so what it reads is that job's.
//
// The job is passed by reference, type-erased without allocating (no std::function), so a
// parallel section in the decode loop allocates nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>  // not needed here; kept because includers rely on it transitively
#include <mutex>
#include <thread>
#include <type_traits>
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

  // Calls fn(begin, end) over [0, n) split into chunks of at least `grain` items. `fn` is any
  // callable (int64_t, int64_t); it is only referenced, never copied.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, grain, RangeFn{const_cast<void*>(static_cast<const void*>(&fn)),
                          [](void* f, int64_t b, int64_t e) { (*static_cast<Fn*>(f))(b, e); }});
  }

 private:
  struct RangeFn {  // a non-owning reference to the caller's callable
    void* obj = nullptr;
    void (*call)(void*, int64_t, int64_t) = nullptr;
    void operator()(int64_t b, int64_t e) const { call(obj, b, e); }
  };
  void run(int64_t n, int64_t grain, RangeFn fn);
  void worker_loop();
  // Claims and runs chunks of the current job until none is left; returns how many it ran.
  int64_t run_chunks();

  // State word: generation (24 bits) | chunk count (20 bits) | next chunk (20 bits).
  static constexpr int kChunkBits = 20;
  static constexpr uint64_t kChunkMask = (uint64_t{1} << kChunkBits) - 1;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};  // chunks of the current job finished
  // The current job: written by the submitting thread before it publishes state_, read by a
  // worker only after it claimed a chunk of that job.
  RangeFn job_;
  std::vector<int64_t> bounds_;  // chunk c is [bounds_[c], bounds_[c+1]); grows once

  std::mutex submit_mu_;  // serialises whole jobs
  std::mutex mu_;         // sleeping workers and stop_
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> workers_;
};

}  // namespace kiln::engine
