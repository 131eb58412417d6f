#include "agent/worker_pool.h"

#include <iostream>

namespace kiln::agent {

WorkerPool::WorkerPool(WorkerOptions options, store::Store& store, ModelProvider models, int workers)
    : options_(std::move(options)), store_(store), models_(std::move(models)), workers_(workers < 1 ? 1 : workers) {}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::start() {
  if (!threads_.empty()) return;
  sandbox::ProbeReport probe = sandbox::probe(options_.sandbox);
  if (probe.usable) {
    std::cerr << "level=info component=agent msg=\"sandbox usable: build commands run under bwrap\"\n";
  } else {
    options_.sandbox_unusable = probe.reason.empty() ? "the sandbox probe failed" : probe.reason;
    std::cerr << "level=error component=agent msg=\"the sandbox (bubblewrap) is UNUSABLE on this host; every build will "
                 "end with infra_error until it is fixed (run `kiln sandbox probe` for details)\" reason=\""
              << options_.sandbox_unusable << "\"\n"
              << probe.to_text();
  }
  stopping_ = false;
  maybe_sweep();
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this, i] { work(i); });
}

void WorkerPool::stop() {
  stopping_ = true;
  {
    std::lock_guard lock(mutex_);
    for (StopSignal* signal : running_) signal->request(StopCause::shutdown);
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void WorkerPool::maybe_sweep() {
  if (options_.keep_workspaces) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t due = next_sweep_ms_.load();
  // One worker sweeps; the others see the moved deadline.
  if (now < due || !next_sweep_ms_.compare_exchange_strong(due, now + 60'000)) return;
  if (int removed = sweep_workspaces(store_, options_.workspace_root); removed > 0)
    std::cerr << "level=info component=agent msg=\"removed workspaces of ended builds\" count=" << removed << "\n";
}

void WorkerPool::work(int index) {
  store::ClaimRequest request;
  request.owner = options_.owner + "/worker-" + std::to_string(index);
  request.lease_ms = options_.lease_ms;
  request.models = options_.models;
  request.stop_claiming = &stopping_;  // raised before running builds are told to stop
  while (!stopping_) {
    maybe_sweep();  // builds recovery ended (or a crash left) may have left workspaces
    // Short waits so stop() is seen promptly without touching the store's shared wake-ups.
    auto claimed = store_.claim_wait(request, std::chrono::milliseconds(250));
    if (!claimed.ok()) {
      std::cerr << "level=warn component=agent worker=" << index << " msg=\"claim failed\" error=\""
                << claimed.error().message << "\"\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    if (!claimed.value()) continue;
    const store::Build build = std::move(*claimed.value());
    if (stopping_) {
      // Claimed while the pool stops (often a build a sibling has just handed back): hand it back
      // untouched rather than set it up only to stop it, one attempt per idle worker.
      if (auto released = store_.release(build.id, build.attempt); !released.ok())
        std::cerr << "level=warn component=agent worker=" << index << " build=" << build.id
                  << " msg=\"hand-back at shutdown failed\" error=\"" << released.error().message << "\"\n";
      break;
    }
    StopSignal signal;
    {
      std::lock_guard lock(mutex_);
      running_.insert(&signal);
      if (stopping_) signal.request(StopCause::shutdown);
    }
    ++busy_;
    BuildReport report = run_build(store_, build, options_, models_, signal);
    --busy_;
    ++done_;
    {
      std::lock_guard lock(mutex_);
      running_.erase(&signal);
    }
    std::cerr << "level=info component=agent worker=" << index << " build=" << build.id
              << " attempt=" << build.attempt << " finished=" << report.finished
              << " status=" << store::to_string(report.status) << " reason=" << store::to_string(report.reason)
              << " msg=\"" << report.message << "\"\n";
  }
}

}  // namespace kiln::agent
