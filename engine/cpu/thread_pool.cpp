#include "engine/cpu/thread_pool.h"

#include <algorithm>

namespace kiln::engine {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    published_.store(++generation_, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
constexpr int kSpinIterations = 20000;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t b = next_.fetch_add(chunk_);
    if (b >= n_) return;
    (*job_)(b, std::min(n_, b + chunk_));
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinIterations && published_.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // pairs with the waiter's predicate check
      done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);
  // Chunks: a few per thread for balance, never below the grain.
  const int64_t chunk = std::max(grain, (n + int64_t(size()) * 4 - 1) / (int64_t(size()) * 4));
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0);
    active_.store(int(workers_.size()));  // every worker checks in once per job
    published_.store(++generation_, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks();
  // Wait until every worker has seen this job and left it, so none reads it late.
  for (int i = 0; i < kSpinIterations && active_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
}

}  // namespace kiln::engine
