// kiln::tools — what the agent can do, and nothing more. The only header other folders include
// (it includes tools/git.h for kiln's own git operations).
//
// Contract:
// - A Tool has a name, a description and a JSON Schema for its arguments (these go into the
//   model's prompt), and a run function. Tools never throw at the agent: every failure, including
//   bad arguments and paths that leave the workspace, comes back as a ToolResult with is_error.
// - Paths given by the model are resolved inside Context::workspace: absolute paths outside it
//   (other than /workspace/..., the path the model sees in bash), `..` escapes and symlinks that
//   leave the workspace are refused with a message saying so. The .git directory is never written.
// - The edit tools preserve every byte outside the edited span (CRLF, tabs, BOM, final newline).
// Thread-safety: a ToolRegistry is immutable after construction and may be shared; a Context
// belongs to one build and is used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sandbox/sandbox.h"
#include "tools/git.h"

namespace kiln::tools {

// Per-build state the tools run against.
struct Context {
  std::filesystem::path workspace;  // host path of the build's clone
  sandbox::Policy policy;           // for `bash`; run() forces policy.workspace = workspace
  std::chrono::milliseconds max_command_timeout{120'000};  // `bash` timeouts are clamped to this
  const std::atomic<bool>* cancel = nullptr;  // set by the agent to stop a running tool (~100 ms)
  std::string build_id;
  int outputs_saved = 0;  // how many `.kiln/outputs/<n>.log` files bash has written in this build
};

struct ToolResult {
  std::string text;       // what the model sees
  nlohmann::json data = nlohmann::json::object();  // structured record for the event log
  bool is_error = false;  // the call failed (bad args, refused path, nonzero exit, timeout, ...)
  bool finished = false;  // `submit` was called: the agent ends the build (data["summary"])
};

struct Tool {
  std::string name;
  std::string description;
  nlohmann::json schema;  // JSON Schema of the arguments object ("type": "object")
  std::function<ToolResult(const nlohmann::json& args, Context& ctx)> run;
};

// Names tools and dispatches calls. call() checks the arguments against the schema first
// (object, required fields, property types, no unknown fields) and answers unknown tool names
// with the list of known ones.
class ToolRegistry {
 public:
  void add(Tool tool);  // replaces a tool of the same name
  const std::vector<Tool>& tools() const { return tools_; }
  const Tool* find(std::string_view name) const;
  // [{"type":"function","function":{"name","description","parameters"}}, ...] for the prompt.
  nlohmann::json prompt_schemas() const;
  ToolResult call(std::string_view name, const nlohmann::json& args, Context& ctx) const;

 private:
  std::vector<Tool> tools_;
};

// Returns "" when args satisfy schema, else a message naming the field at fault.
std::string validate_args(const nlohmann::json& schema, const nlohmann::json& args);

// The individual tools (one file each under tools/).
Tool bash_tool();
Tool view_tool();
Tool create_tool();
Tool str_replace_tool();
Tool insert_tool();
Tool grep_tool();
Tool submit_tool();
// bash, view, create, str_replace, insert, grep, submit.
ToolRegistry default_registry();

// How much of a command's output `bash` shows the model (head + tail, with a marker between).
inline constexpr std::size_t kShownOutputBytes = 10 * 1024;

}  // namespace kiln::tools
