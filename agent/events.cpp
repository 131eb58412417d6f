#include "agent/events.h"

namespace kiln::agent {

bool MemoryEventSink::emit(std::string_view kind, const Json& payload) {
  std::lock_guard lock(mutex_);
  events_.push_back({std::string(kind), payload});
  return true;
}

std::vector<MemoryEventSink::Event> MemoryEventSink::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

TextBatcher::TextBatcher(EventSink& sink, std::chrono::milliseconds interval)
    : sink_(sink), interval_(interval), last_flush_(std::chrono::steady_clock::now()) {}

void TextBatcher::add(std::string_view kind, std::string_view text) {
  if (kind != kind_) {
    flush();
    kind_ = std::string(kind);
  }
  pending_ += text;
  if (std::chrono::steady_clock::now() - last_flush_ >= interval_) flush();
}

bool TextBatcher::flush() {
  if (!pending_.empty()) {
    if (!sink_.emit(kind_, Json{{"text", pending_}})) refused_ = true;
    pending_.clear();
  }
  last_flush_ = std::chrono::steady_clock::now();
  return !refused_;
}

}  // namespace kiln::agent
