// kiln::agent — the build loop and the worker pipeline. The one header other folders include.
//   chat_model.h           ChatModel (where turns come from), messages, usage
//   scripted_chat_model.h  ScriptedChatModel, the test double
//   loop.h                 run_agent: task → stop reason, transcript, counters
//   budgets.h, events.h, tool_executor.h, compaction.h, transcript.h, stop_signal.h
#pragma once

#include "agent/budgets.h"
#include "agent/chat_model.h"
#include "agent/events.h"
#include "agent/loop.h"
#include "agent/scripted_chat_model.h"
#include "agent/stop_signal.h"
#include "agent/tool_executor.h"
