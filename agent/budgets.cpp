#include "agent/budgets.h"

namespace kiln::agent {

std::string_view stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::submitted: return "submitted";
    case StopReason::step_limit: return "step_limit";
    case StopReason::token_limit: return "token_limit";
    case StopReason::time_limit: return "time_limit";
    case StopReason::cancelled: return "cancelled";
    case StopReason::lease_lost: return "lease_lost";
    case StopReason::shutdown: return "shutdown";
    case StopReason::model_error: return "model_error";
    case StopReason::infra_error: return "infra_error";
  }
  return "unknown";
}

void Counters::add_turn(const TurnUsage& u) {
  ++steps;
  prefilled_tokens += u.prefilled_tokens;
  reused_tokens += u.reused_tokens;
  generated_tokens += u.generated_tokens;
  reasoning_tokens += u.reasoning_tokens;
  context_tokens = u.context_tokens;
  prefill_s += u.prefill_s;
  decode_s += u.decode_s;
  wait_s += u.wait_s;
}

void Counters::add_tool(const std::string& name, double seconds) {
  ++tool_calls;
  ++tool_calls_by_name[name];
  tools_s += seconds;
}

Json Counters::to_json() const {
  Json by_name = Json::object();
  for (const auto& [name, n] : tool_calls_by_name) by_name[name] = n;
  return {{"steps", steps},
          {"tool_calls", tool_calls},
          {"tool_calls_by_name", by_name},
          {"tokens_prefilled", prefilled_tokens},
          {"tokens_reused", reused_tokens},
          {"tokens_generated", generated_tokens},
          {"tokens_reasoning", reasoning_tokens},
          {"context_tokens", context_tokens},
          {"compactions", compactions},
          {"prefill_s", prefill_s},
          {"decode_s", decode_s},
          {"tools_s", tools_s}};
}

Deadline Deadline::after(double seconds) {
  auto d = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  return {std::chrono::steady_clock::now() + d};
}

double Deadline::remaining_s() const {
  return std::chrono::duration<double>(at - std::chrono::steady_clock::now()).count();
}

std::optional<BudgetStop> check_budgets(const Limits& limits, const Counters& c, const Deadline& deadline) {
  if (c.steps >= limits.max_steps)
    return BudgetStop{StopReason::step_limit,
                      "step limit reached: " + std::to_string(c.steps) + " of " + std::to_string(limits.max_steps) + " turns"};
  if (c.generated_tokens >= limits.max_generated_tokens)
    return BudgetStop{StopReason::token_limit, "token limit reached: " + std::to_string(c.generated_tokens) + " of " +
                                                   std::to_string(limits.max_generated_tokens) + " generated tokens"};
  if (deadline.passed())
    return BudgetStop{StopReason::time_limit,
                      "time limit reached: " + std::to_string(static_cast<int64_t>(limits.max_wall_s)) + " s of wall time"};
  return std::nullopt;
}

}  // namespace kiln::agent
