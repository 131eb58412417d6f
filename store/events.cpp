// The event log: append (fenced by attempt), read after a seq, and wait for new events.
// Invariant: a build's seqs are 1, 2, 3, ... without gaps; the next seq is computed inside the
// inserting statement under the write lock, and (build_id, seq) is the primary key.
#include <nlohmann/json.hpp>

#include "store/store_impl.h"

namespace kiln::store {
namespace {

using detail::Db;
using detail::Query;
using detail::WriteTxn;

}  // namespace

namespace detail {

std::optional<Error> validate_event(std::string_view kind, std::string_view payload_json) {
  if (kind.empty() || kind.size() > 64) {
    return Error{ErrorCode::invalid_argument, "event kind must be 1 to 64 bytes", "kind"};
  }
  if (!nlohmann::json::accept(payload_json)) {
    return Error{ErrorCode::invalid_argument,
                 "event payload is not valid JSON: " + std::string(payload_json.substr(0, 80)), "payload"};
  }
  return std::nullopt;
}


Result<int64_t> insert_event(Db& db, int64_t build_id, int attempt, int64_t ts_ms, std::string_view kind,
                             std::string_view payload_json) {
  Result<Query> q = db.query(
      "INSERT INTO build_events(build_id, seq, attempt, ts_ms, kind, payload_json) VALUES "
      "(?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM build_events WHERE build_id = ?1), "
      "?2, ?3, ?4, ?5) RETURNING seq");
  if (!q) return q.error();
  q->bind(1, build_id).bind(2, attempt).bind(3, ts_ms).bind(4, kind).bind(5, payload_json);
  Result<bool> row = q->step();
  if (!row) return row.error();
  int64_t seq = q->i64(0);
  if (Status s = q->run(); !s) return s.error();
  return seq;
}

Result<int64_t> insert_status_event(Db& db, const Build& b, int64_t ts_ms) {
  nlohmann::json payload = {{"status", to_string(b.status)}, {"attempt", b.attempt}};
  if (b.outcome) payload["outcome"] = to_string(*b.outcome);
  if (b.lease_owner) payload["lease_owner"] = *b.lease_owner;
  if (b.cancel_requested) payload["cancel_requested"] = true;
  if (b.error_message) payload["error_message"] = *b.error_message;
  return insert_event(db, b.id, b.attempt, ts_ms, event_kind::status, payload.dump());
}

Error fence_error(Db& db, int64_t build_id, int attempt, std::string_view operation) {
  Result<Query> q = db.query("SELECT status, attempt FROM builds WHERE id = ?");
  if (!q) return q.error();
  q->bind(1, build_id);
  Result<bool> row = q->step();
  if (!row) return row.error();
  std::string id = "build " + std::to_string(build_id);
  if (!*row) return Error{ErrorCode::not_found, id + " does not exist", ""};
  return Error{ErrorCode::fenced,
               id + ": " + std::string(operation) + " by attempt " + std::to_string(attempt) +
                   " rejected; the build is now " + q->text(0) + " at attempt " + std::to_string(q->i64(1)) +
                   " (the lease was lost or the build finished)",
               ""};
}

}  // namespace detail

Result<int64_t> Store::append_event(int64_t build_id, int attempt, std::string_view kind,
                                    std::string_view payload_json) {
  return append_events(build_id, attempt, {NewEvent{std::string(kind), std::string(payload_json)}});
}

Result<int64_t> Store::append_events(int64_t build_id, int attempt, const std::vector<NewEvent>& events) {
  if (events.empty()) return Error{ErrorCode::invalid_argument, "no events to append", "events"};
  for (const NewEvent& e : events) {
    if (std::optional<Error> err = detail::validate_event(e.kind, e.payload_json)) return *err;
  }
  return impl_->write([&](Db& db) -> Result<int64_t> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    {
      Result<Query> q = db.query("SELECT 1 FROM builds WHERE id = ? AND attempt = ? AND status = 'running'");
      if (!q) return q.error();
      q->bind(1, build_id).bind(2, attempt);
      Result<bool> row = q->step();
      if (!row) return row.error();
      if (!*row) return detail::fence_error(db, build_id, attempt, "event append");
    }
    int64_t seq = 0;
    for (const NewEvent& e : events) {
      Result<int64_t> s = detail::insert_event(db, build_id, attempt, now, e.kind, e.payload_json);
      if (!s) return s.error();
      seq = *s;
    }
    if (Status s = txn->commit(); !s) return s.error();
    impl_->notifier->on_event(build_id, seq, /*terminal=*/false);
    return seq;
  });
}

Result<std::vector<Event>> Store::read_events(int64_t build_id, int64_t after_seq, int limit) {
  if (limit < 1 || limit > 10000) {
    return Error{ErrorCode::invalid_argument,
                 "limit must be between 1 and 10000, got " + std::to_string(limit), "limit"};
  }
  if (after_seq < 0) return Error{ErrorCode::invalid_argument, "after must be >= 0", "after"};
  return impl_->read([&](Db& db) -> Result<std::vector<Event>> {
    std::vector<Event> events;
    {
      Result<Query> q = db.query(
          "SELECT seq, attempt, ts_ms, kind, payload_json FROM build_events "
          "WHERE build_id = ? AND seq > ? ORDER BY seq LIMIT ?");
      if (!q) return q.error();
      q->bind(1, build_id).bind(2, after_seq).bind(3, limit);
      while (true) {
        Result<bool> row = q->step();
        if (!row) return row.error();
        if (!*row) break;
        events.push_back(
            Event{build_id, q->i64(0), static_cast<int>(q->i64(1)), q->i64(2), q->text(3), q->text(4)});
      }
    }
    if (events.empty()) {
      // Tell "no such build" from "no new events": every build has at least its queued event.
      Result<Query> q = db.query("SELECT 1 FROM builds WHERE id = ?");
      if (!q) return q.error();
      Result<bool> row = q->bind(1, build_id).step();
      if (!row) return row.error();
      if (!*row) {
        return Error{ErrorCode::not_found, "build " + std::to_string(build_id) + " does not exist", ""};
      }
    }
    return events;
  });
}

Result<std::vector<Event>> Store::wait_for_events(int64_t build_id, int64_t after_seq, int limit,
                                                  std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  // Events appended by another process do not notify us; poll at this interval for those.
  constexpr std::chrono::milliseconds kPoll{500};
  auto deadline = clock::now() + timeout;
  Notifier& n = *impl_->notifier;
  while (true) {
    Result<std::vector<Event>> events = read_events(build_id, after_seq, limit);
    if (!events || !events->empty() || impl_->stopped.load()) return events;
    auto now = clock::now();
    if (now >= deadline) return events;
    std::unique_lock lock(n.mu);
    // An append that committed after our read has already raised latest_seq (it does so
    // before notifying), so checking it under the lock closes the lost-wake-up window.
    n.cv.wait_until(lock, std::min(deadline, now + kPoll), [&] {
      auto it = n.latest_seq.find(build_id);
      return impl_->stopped.load() || (it != n.latest_seq.end() && it->second > after_seq);
    });
  }
}

}  // namespace kiln::store
