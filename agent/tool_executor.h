// ToolExecutor: what the loop needs from tools/ — the schemas to show the model and a way to
// run one call. tools_adapter.h implements it over the real tools registry and sandbox.
// Contract: run() never throws for the outside world; a failing tool (bad arguments, non-zero
// exit, timeout) is an observation for the model, not an agent error. `stop` may be set from
// another thread and must end a running command promptly (the sandbox kills its process group).
// Threading: called from the build's worker thread only.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "agent/chat_model.h"

namespace kiln::agent {

struct ToolObservation {
  std::string text;          // what the model sees (already truncated with a marker if long)
  bool ok = true;            // false: the tool failed (the text says how)
  bool submitted = false;    // the call was `submit`: the model declares it is done
  bool infra_error = false;  // kiln's machinery (the sandbox) failed, not the command: ends the build
  std::string summary;       // submit: the model's summary
  Json data = Json::object();  // structured details for the event log (exit code, paths, …)
};

class ToolExecutor {
 public:
  virtual ~ToolExecutor() = default;
  virtual std::vector<ToolSchema> schemas() const = 0;
  // `timeout_s` caps a command (the build's remaining wall time); 0 = the tool's default.
  virtual ToolObservation run(const ToolCall& call, double timeout_s, const std::atomic<bool>& stop) = 0;
};

}  // namespace kiln::agent
