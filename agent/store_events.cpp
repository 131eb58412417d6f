#include "agent/store_events.h"

#include <iostream>

namespace kiln::agent {

StoreEventSink::StoreEventSink(store::Store& store, int64_t build_id, int attempt)
    : store_(store), build_id_(build_id), attempt_(attempt) {}

bool StoreEventSink::emit(std::string_view kind, const Json& payload) {
  auto r = store_.append_event(build_id_, attempt_, kind, payload.dump(-1, ' ', false, Json::error_handler_t::replace));
  if (r.ok()) return true;
  if (r.error().code == store::ErrorCode::fenced) return false;
  ++failed_;
  std::lock_guard lock(mutex_);
  last_error_ = r.error().message;
  std::cerr << "level=warn component=agent build=" << build_id_ << " msg=\"event append failed\" error=\""
            << r.error().message << "\"\n";
  return true;
}

std::string StoreEventSink::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

}  // namespace kiln::agent
