// RegistryToolExecutor: the loop's ToolExecutor over the real tools registry (tools/tools.h).
// It points the build's tools::Context at the stop flag for the length of each call (so the
// sandbox kills a running command when the build is cancelled, loses its lease or runs out of
// time), clamps command timeouts to the wall time left, and marks sandbox failures (data
// "infra_error") so the loop ends the build with infra_error instead of blaming the model.
// Threading: the build thread only (a tools::Context is single-threaded).
#pragma once

#include "agent/tool_executor.h"
#include "tools/tools.h"

namespace kiln::agent {

class RegistryToolExecutor final : public ToolExecutor {
 public:
  RegistryToolExecutor(const tools::ToolRegistry& registry, tools::Context& context);
  std::vector<ToolSchema> schemas() const override;
  ToolObservation run(const ToolCall& call, double timeout_s, const std::atomic<bool>& stop) override;

 private:
  const tools::ToolRegistry& registry_;
  tools::Context& context_;
  const std::chrono::milliseconds max_timeout_;
};

}  // namespace kiln::agent
