// Dispatcher: loads the configured models into the in-process engine and runs the agent's
// WorkerPool over the store, so queued builds are carried to an outcome. Beast-free.
// A model that fails to load is logged and shown in /v1/models; its builds end with model_error.
// Lifecycle: start() -> running -> stop() (the pool stops first; models outlive every build).
#pragma once

#include <iosfwd>
#include <memory>

#include "server/config.h"

namespace kiln::store {
class Store;
}

namespace kiln::server {

class ModelRegistry;

class Dispatcher {
 public:
  static std::unique_ptr<Dispatcher> start(const ServerConfig& config, store::Store& store, ModelRegistry& registry,
                                           std::ostream& log);
  ~Dispatcher();
  void stop();  // idempotent

  struct Impl;

 private:
  explicit Dispatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
