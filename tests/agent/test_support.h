// Helpers shared by the agent tests: temp directories, a store in one, example repositories.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "store/store.h"

namespace kiln::agent::testing {

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A store file in `dir` whose clock the test moves (ms since the epoch).
struct TestStore {
  std::shared_ptr<std::atomic<int64_t>> clock = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  std::unique_ptr<store::Store> store;
  explicit TestStore(const std::filesystem::path& dir, bool fake_clock = false);
};

// Copies examples/repos/<name> to `dest` and makes it a git repository with one commit.
// Returns "" or an error message.
std::string make_example_repo(const std::string& name, const std::filesystem::path& dest);

// Runs a shell command (test setup only), returns its exit code.
int shell(const std::string& command);
// Runs a shell command (test checks only), returns its stdout.
std::string capture(const std::string& command);
std::string read_file(const std::filesystem::path& path);

}  // namespace kiln::agent::testing

#include "agent/scripted_chat_model.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "agent/tools_adapter.h"
#include "tools/tools.h"

namespace kiln::agent::testing {

// A cloned example repository in a temp dir with the real tools pointed at it.
struct Workspace {
  TempDir dir;
  std::filesystem::path source;     // the example as a git repository
  std::filesystem::path workspace;  // the clone the tools work in
  tools::ToolRegistry registry = tools::default_registry();
  tools::Context context;
  std::unique_ptr<RegistryToolExecutor> executor;
  explicit Workspace(const std::string& example);
};

inline ToolCall call(std::string name, Json arguments) { return {"", std::move(name), std::move(arguments)}; }
inline ScriptedTurn turn_with(ToolCall c, std::string reasoning = "") {
  ScriptedTurn t;
  t.reasoning = std::move(reasoning);
  t.calls.push_back(std::move(c));
  return t;
}

// A random-weight make-tiny model (MoE, 4 layers, vocab 1024) with the tiny Qwen tokenizer.
struct TinyEngine {
  TempDir dir;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Tokenizer> tokenizer;
  // chat_template: a Jinja file to put in tokenizer_config.json (picks the template flavour); ""
  // keeps the tiny tokenizer's own.
  explicit TinyEngine(int64_t max_positions = 8192, const std::string& chat_template = "");
};

// The fix for examples/repos/stats-py, as the tool calls a model would make.
ToolCall fix_median_call();

}  // namespace kiln::agent::testing
