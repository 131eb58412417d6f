// Budgets: the limits a build runs under, and the one struct of counters the loop updates.
// Every limit is checked *before* the model is asked for a turn (check_budgets), so a build
// never starts work it may not finish; a turn that runs out of generated tokens mid-way ends
// the build with token_limit. The context limit comes from the model (ChatModel::context_limit),
// never learned from an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "agent/chat_model.h"

namespace kiln::agent {

struct Limits {
  int max_steps = 100;                    // model turns
  int64_t max_generated_tokens = 200000;  // over the whole build, reasoning included
  double max_wall_s = 3600;               // agent phase wall time
  int64_t max_turn_tokens = 16384;        // cap on one turn's generation
  int64_t min_turn_tokens = 1024;         // room a turn needs in the context, else compaction
  int max_format_errors = 3;              // consecutive malformed turns → model_error
  int loop_repeats = 3;                   // identical call+result this many times in a row = a loop
  int keep_recent_turns = 4;              // compaction keeps this many assistant turns whole
};

// Why the agent stopped. Maps onto the store's outcome reasons in the pipeline.
enum class StopReason {
  submitted,
  step_limit,
  token_limit,  // generated-token budget, or the context is full even after compaction
  time_limit,
  cancelled,
  lease_lost,
  shutdown,
  model_error,  // malformed output 3× in a row, a loop, or the model failed
  infra_error,  // the store or a tool's machinery failed (not the tool's own failure)
};
std::string_view stop_reason_name(StopReason reason);

// All counters of a build, updated in one place (add_turn / add_tool). Owned by the build thread.
struct Counters {
  int steps = 0;
  int tool_calls = 0;
  std::map<std::string, int> tool_calls_by_name;
  int64_t prefilled_tokens = 0;
  int64_t reused_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t reasoning_tokens = 0;
  int64_t context_tokens = 0;  // the session's length after the last turn
  int compactions = 0;
  double prefill_s = 0, decode_s = 0, tools_s = 0;
  double wait_s = 0;  // waiting for engine memory (TurnUsage::wait_s)

  void add_turn(const TurnUsage& usage);
  void add_tool(const std::string& name, double seconds);
  Json to_json() const;
};

struct Deadline {
  std::chrono::steady_clock::time_point at;
  static Deadline after(double seconds);
  double remaining_s() const;
  bool passed() const { return remaining_s() <= 0; }
};

// The first budget already exhausted, if any, with a message saying which and by how much.
struct BudgetStop {
  StopReason reason;
  std::string message;
};
std::optional<BudgetStop> check_budgets(const Limits& limits, const Counters& counters, const Deadline& deadline);

}  // namespace kiln::agent
