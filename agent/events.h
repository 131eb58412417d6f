// Build events as the agent emits them, and the batching of streamed text.
// EventSink is what the loop and the pipeline need from store/ (store_adapter.h writes to the
// real event log). emit() returns false when the store refused the event because this worker's
// attempt no longer owns the build (fencing): the caller treats that as a lost lease.
// Kinds: status, model_text, reasoning, tool_call, tool_result, log, metric, error, compaction.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "agent/chat_model.h"

namespace kiln::agent {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual bool emit(std::string_view kind, const Json& payload) = 0;
};

// Keeps events in memory (thread-safe). Used by `kiln` tools that run the agent without a
// store, and by tests to read what was emitted.
class MemoryEventSink final : public EventSink {
 public:
  struct Event {
    std::string kind;
    Json payload;
  };
  bool emit(std::string_view kind, const Json& payload) override;
  std::vector<Event> events() const;

 private:
  mutable std::mutex mutex_;
  std::vector<Event> events_;  // guarded by mutex_
};

// Batches streamed model text/reasoning into one event per kind at most every `interval`
// (a watcher sees the build live without one event per token). Order is kept: switching kind
// flushes the other. flush() at the end of a turn. Owned by the build thread.
class TextBatcher {
 public:
  explicit TextBatcher(EventSink& sink, std::chrono::milliseconds interval = std::chrono::milliseconds(100));
  ~TextBatcher() { flush(); }
  void add(std::string_view kind, std::string_view text);
  bool flush();  // false if the sink refused

 private:
  EventSink& sink_;
  std::chrono::milliseconds interval_;
  std::string kind_;
  std::string pending_;
  std::chrono::steady_clock::time_point last_flush_;
  bool refused_ = false;

 public:
  bool refused() const { return refused_; }
};

}  // namespace kiln::agent
