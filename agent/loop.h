// The agent loop: from a task to a stop reason, with every turn, tool call and token recorded.
// Read loop.cpp first; its Agent::run is the whole story on one screen.
//
// Contract: run_agent never throws for outside-world trouble (model, tools, store); every way
// of stopping is a StopReason plus a message, and that message is also the transcript's last
// entry (Role::exit). The transcript only grows, except for an explicit, recorded compaction.
// Threading: runs on the calling (build) thread; `stop` may be set from any thread and ends a
// generation or a running tool promptly.
#pragma once

#include <string>
#include <vector>

#include "agent/budgets.h"
#include "agent/chat_model.h"
#include "agent/events.h"
#include "agent/stop_signal.h"
#include "agent/tool_executor.h"

namespace kiln::agent {

struct AgentTask {
  std::string task;            // the user's words, sent as the first user message
  std::string repo;            // where the code came from (URL or path, and ref), for the prompt
  std::string verify_command;  // how kiln will check the result (told to the model), may be empty
  std::string resume_note;     // a re-claimed build: what state the workspace is in
};

struct AgentResult {
  StopReason reason = StopReason::infra_error;
  std::string message;  // why it stopped; also the transcript's last entry
  std::string summary;  // submit's summary, when submitted
  Counters counters;
  std::vector<Message> transcript;
};

AgentResult run_agent(const AgentTask& task, const Limits& limits, ChatModel& model, ToolExecutor& tools,
                      EventSink& events, StopSignal& stop);

// What kiln asks of the model: the task, the repo, the tools, how to finish (prompts.cpp).
std::string system_prompt(const AgentTask& task);
std::string task_message(const AgentTask& task);

}  // namespace kiln::agent
