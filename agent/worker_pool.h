// WorkerPool: N worker threads, each claiming one build at a time from the store and carrying
// it through run_build (worker.h). The server starts one from `kiln serve`:
//
//   WorkerPool pool(options, store, provider, workers);   // workers: default = engine session slots
//   pool.start();  ...  pool.stop();                       // stop(): running builds are handed
//                                                          // back to the queue (Store::release)
// Workspaces of ended builds are swept at start() and then about once a minute (sweep_workspaces),
// unless options.keep_workspaces.
// State list: constructed → start() → running → stop() → stopped (the destructor stops).
// Threading: start/stop from one owning thread. Each worker thread owns its claimed build and
// its StopSignal; stop() only sets those signals (through the mutex-guarded registry) and joins.
#pragma once

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "agent/worker.h"

namespace kiln::agent {

class WorkerPool {
 public:
  WorkerPool(WorkerOptions options, store::Store& store, ModelProvider models, int workers);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Probes the sandbox once (sandbox::probe) and logs the verdict: when it is unusable, says why,
  // and every build this pool claims ends with infra_error naming that reason. Then starts the threads.
  void start();
  const std::string& sandbox_unusable() const { return options_.sandbox_unusable; }
  void stop();
  int busy() const { return busy_.load(); }               // workers carrying a build now
  int64_t builds_done() const { return done_.load(); }    // builds carried to an end (any)

 private:
  void work(int index);
  WorkerOptions options_;  // sandbox_unusable is set by start(), before any thread reads it
  store::Store& store_;
  const ModelProvider models_;
  const int workers_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> busy_{0};
  std::atomic<int64_t> done_{0};
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::set<StopSignal*> running_;  // guarded by mutex_: the signals of builds being carried
  std::atomic<int64_t> next_sweep_ms_{0};  // steady-clock ms of the next workspace sweep
  void maybe_sweep();
};

}  // namespace kiln::agent
