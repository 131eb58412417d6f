// Dispatcher: runs the agent's WorkerPool over the store, so queued builds are carried to an
// outcome, with the configured models behind it: engine models through a ModelHost (loaded on
// first use, unloaded when idle or when memory is short; a sweeper thread checks once a second),
// scripted test models replayed from the config. Beast-free.
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
class ModelHost;

class Dispatcher {
 public:
  static std::unique_ptr<Dispatcher> start(const ServerConfig& config, store::Store& store, ModelRegistry& registry,
                                           std::ostream& log);
  ~Dispatcher();
  void stop();  // idempotent
  ModelHost* host();  // the engine models' host

  struct Impl;

 private:
  explicit Dispatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
