#include "engine/cpu/thread_pool.h"

#include <algorithm>

#include "engine/cpu/denormals.h"

namespace kiln::engine {

namespace {
constexpr int kSpinIterations = 20000;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::run_chunks() {
  int64_t ran = 0;
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = s & kChunkMask, count = (s >> kChunkBits) & kChunkMask;
    if (next >= count) return ran;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Claimed chunk `next` of the job published in s: that job is still running (this chunk is
    // not done), so job_ and bounds_ are its own.
    job_(bounds_[next], bounds_[next + 1]);
    done_.fetch_add(1, std::memory_order_acq_rel);
    ++ran;
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  cpu::set_engine_float_mode();  // not whatever the thread that built the pool had set
  uint64_t seen = state_.load(std::memory_order_acquire) >> (2 * kChunkBits);
  for (;;) {
    auto fresh = [&] { return (state_.load() >> (2 * kChunkBits)) != seen; };
    for (int i = 0; i < kSpinIterations && !fresh() && !stopping_.load(std::memory_order_relaxed); ++i) cpu_relax();
    if (!fresh()) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);  // seq_cst: pairs with the submitter's store of state_, then load
      wake_.wait(lock, [&] { return stop_ || fresh(); });
      sleepers_.fetch_sub(1);
      if (stop_) return;
    }
    if (stopping_.load()) return;
    seen = state_.load(std::memory_order_acquire) >> (2 * kChunkBits);
    run_chunks();
  }
}

void ThreadPool::run(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);
  // Chunks shrink towards the end (guided scheduling): at most n / (4·threads) each, then half
  // of an even share of what is left, never below the grain (nor more than the state word can
  // count). Equal chunks of n / (4·threads) left the threads of a decode section finishing up to
  // a whole chunk apart (~1/8 of the section at 2 threads); shrinking ones end within about a
  // grain of each other, and a descheduled worker still holds at most n / (4·threads).
  // The previous job is complete (its submitter saw every chunk done), so no worker reads these.
  const int64_t P = size();
  const int64_t first = std::max(grain, (n + 4 * P - 1) / (4 * P));
  const int64_t floor = std::max<int64_t>(grain, (n + int64_t(kChunkMask) - 1) / int64_t(kChunkMask));
  bounds_.clear();
  bounds_.push_back(0);
  for (int64_t b = 0; b < n;) {
    const int64_t c = std::clamp((n - b + 2 * P - 1) / (2 * P), floor, std::max(first, floor));
    b = std::min(n, b + c);
    bounds_.push_back(b);
  }
  const int64_t count = int64_t(bounds_.size()) - 1;
  job_ = fn;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = ((state_.load(std::memory_order_relaxed) >> (2 * kChunkBits)) + 1) & 0xffffff;
  state_.store((gen << (2 * kChunkBits)) | (uint64_t(count) << kChunkBits));  // seq_cst: publishes the job
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }  // a worker between its check and its wait holds mu_
    wake_.notify_all();
  }
  run_chunks();
  // Only chunks that were claimed are waited for; each is running on some thread right now.
  for (int i = 0; done_.load(std::memory_order_acquire) != count; ++i) {
    if (i < kSpinIterations) cpu_relax();
    else std::this_thread::yield();  // the holder was descheduled: let it run
  }
}

}  // namespace kiln::engine
