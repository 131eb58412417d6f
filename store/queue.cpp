// The build queue: submit, claim, heartbeat, finish, cancel, recover (state list in store.h).
// Every transition runs in one write transaction with its `status` event, so the event log and
// the builds table never disagree.
#include <tuple>

#include <nlohmann/json.hpp>

#include "store/store_impl.h"

namespace kiln::store {
namespace {

using detail::Db;
using detail::Query;
using detail::WriteTxn;

Error invalid(std::string field, std::string message) {
  return Error{ErrorCode::invalid_argument, std::move(message), std::move(field)};
}

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

std::optional<Error> validate_spec(const BuildSpec& spec, const StoreOptions& options) {
  constexpr size_t kMaxTaskBytes = 1 << 20;
  if (blank(spec.repo)) return invalid("repo", "repo is empty");
  if (spec.repo.size() > 4096) return invalid("repo", "repo is longer than 4096 bytes");
  {
    // A URL ("https://…", "file://…"), scp-like ("git@host:org/repo"), or an absolute path: a
    // relative path would be resolved in the server's working directory, not the submitter's.
    const size_t colon = spec.repo.find(':'), slash = spec.repo.find('/');
    const bool url_or_scp = colon != std::string::npos && (slash == std::string::npos || colon < slash);
    if (!url_or_scp && spec.repo.front() != '/') {
      std::string message = "repo \"";  // appended in place: `"…" + std::string` trips GCC 12's -Wrestrict
      message += spec.repo;
      message += "\" is a relative path; give a URL or an absolute path";
      return invalid("repo", std::move(message));
    }
  }
  if (spec.ref.size() > 1024) return invalid("ref", "ref is longer than 1024 bytes");
  if (blank(spec.task)) return invalid("task", "task is empty");
  if (spec.task.size() > kMaxTaskBytes) return invalid("task", "task is longer than 1 MiB");
  if (spec.verify && blank(*spec.verify)) {
    return invalid("verify", "verify is empty (omit it for a build without a check)");
  }
  if (blank(spec.model)) return invalid("model", "model is empty");
  if (options.allowed_models && !options.allowed_models->count(spec.model)) {
    std::string known;
    for (const std::string& m : *options.allowed_models) known += (known.empty() ? "" : ", ") + m;
    return invalid("model", "unknown model \"" + spec.model +
                                "\" (configured: " + (known.empty() ? "none" : known) + ")");
  }
  std::tuple<const char*, int64_t, int64_t> limits[] = {
      {"limits.max_steps", spec.limits.max_steps, kMaxLimitSteps},
      {"limits.max_tokens", spec.limits.max_tokens, kMaxLimitTokens},
      {"limits.max_wall_s", spec.limits.max_wall_s, kMaxLimitWallSeconds}};
  for (const auto& [field, value, max] : limits) {
    if (value < 0) return invalid(field, std::string(field) + " is negative");
    if (value > max) {
      return invalid(field, std::string(field) + " is above its maximum " + std::to_string(max) + " (got " +
                                std::to_string(value) + ")");
    }
  }
  return std::nullopt;
}

// Which outcome reasons each terminal status admits (see OutcomeReason in store.h).
bool reason_fits(BuildStatus status, OutcomeReason reason) {
  using R = OutcomeReason;
  switch (status) {
    case BuildStatus::succeeded:
      return reason == R::verified || reason == R::no_verify;
    case BuildStatus::failed:
      return reason == R::verify_failed || reason == R::no_verify || reason == R::step_limit ||
             reason == R::token_limit || reason == R::time_limit;
    case BuildStatus::cancelled:
      return reason == R::cancelled;
    case BuildStatus::error:
      return reason == R::infra_error || reason == R::model_error;
    default:
      return false;
  }
}

// The transition's closing steps: the status event, the commit, the wake-ups.
Result<Build> commit_transition(Store::Impl& impl, Db& db, WriteTxn& txn, int64_t build_id, int64_t now,
                                bool include_diff = false) {
  Result<Build> build = detail::load_build(db, build_id, include_diff);
  if (!build) return build;
  Result<int64_t> seq = detail::insert_status_event(db, *build, now);
  if (!seq) return seq.error();
  if (Status s = txn.commit(); !s) return s.error();
  impl.notifier->on_event(build_id, *seq, is_terminal(build->status));
  if (build->status == BuildStatus::queued) impl.notifier->on_work();
  return build;
}

}  // namespace

std::optional<Error> Store::validate(const BuildSpec& spec) const { return validate_spec(spec, impl_->options); }

Result<Build> Store::submit(const BuildSpec& spec) {
  if (std::optional<Error> e = validate_spec(spec, impl_->options)) return *e;
  std::string key = task_key(spec);
  return impl_->write([&](Db& db) -> Result<Build> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    {
      Result<Query> q = db.query(
          "INSERT INTO builds(repo, ref, task, verify, model, task_key, priority, max_steps, "
          "max_tokens, max_wall_s, status, created_ms, queued_ms) "
          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?, ?)");
      if (!q) return q.error();
      q->bind(1, spec.repo).bind(2, spec.ref).bind(3, spec.task).bind(4, spec.verify);
      q->bind(5, spec.model).bind(6, key).bind(7, spec.priority).bind(8, spec.limits.max_steps);
      q->bind(9, spec.limits.max_tokens).bind(10, spec.limits.max_wall_s).bind(11, now).bind(12, now);
      if (Status s = q->run(); !s) return s.error();
    }
    int64_t id = db.last_insert_rowid();
    Result<Query> m = db.query("INSERT INTO build_metrics(build_id) VALUES (?)");
    if (!m) return m.error();
    if (Status s = m->bind(1, id).run(); !s) return s.error();
    return commit_transition(*impl_, db, *txn, id, now);
  });
}

Result<std::optional<Build>> Store::claim(const ClaimRequest& request) {
  if (blank(request.owner)) return invalid("owner", "claim owner is empty");
  if (request.lease_ms <= 0) return invalid("lease_ms", "lease_ms must be positive");
  // The claim itself is the single UPDATE below: the choice of build and the move to running
  // happen in one statement under SQLite's write lock, so two claimers never get the same build.
  std::string sql =
      "UPDATE builds SET status = 'running', attempt = attempt + 1, lease_owner = ?1, "
      "lease_expires_ms = ?2 + ?3, started_ms = ?2 "
      "WHERE id = (SELECT id FROM builds WHERE status = 'queued'";
  if (!request.models.empty()) {
    sql += " AND model IN (";
    for (size_t i = 0; i < request.models.size(); ++i) sql += (i ? ", ?" : "?") + std::to_string(4 + i);
    sql += ")";
  }
  sql += " ORDER BY priority DESC, created_ms, id LIMIT 1) RETURNING id, queued_ms";

  return impl_->write([&](Db& db) -> Result<std::optional<Build>> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    if (request.stop_claiming && request.stop_claiming->load()) return std::optional<Build>();
    int64_t id = 0, queued_ms = 0;
    {
      Result<Query> q = db.query(sql);
      if (!q) return q.error();
      q->bind(1, request.owner).bind(2, now).bind(3, request.lease_ms);
      for (size_t i = 0; i < request.models.size(); ++i) q->bind(static_cast<int>(4 + i), request.models[i]);
      Result<bool> row = q->step();
      if (!row) return row.error();
      if (!*row) return std::optional<Build>();  // nothing queued; the transaction rolls back
      id = q->i64(0);
      queued_ms = q->i64(1);
    }
    Result<Query> m =
        db.query("UPDATE build_metrics SET seconds_queue = seconds_queue + ? WHERE build_id = ?");
    if (!m) return m.error();
    m->bind(1, std::max<int64_t>(0, now - queued_ms) / 1000.0).bind(2, id);
    if (Status s = m->run(); !s) return s.error();
    Result<Build> build = commit_transition(*impl_, db, *txn, id, now);
    if (!build) return build.error();
    return std::optional<Build>(std::move(*build));
  });
}

Result<std::optional<Build>> Store::claim_wait(const ClaimRequest& request,
                                               std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    // Read the epoch before trying, so a submit between the try and the wait is not missed.
    uint64_t epoch = work_epoch();
    Result<std::optional<Build>> claimed = claim(request);
    if (!claimed || claimed->has_value() || impl_->stopped.load()) return claimed;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) return claimed;
    // Another process may submit without notifying us: poll at least once a second.
    wait_for_work(epoch, std::min(left, std::chrono::milliseconds(1000)));
  }
}

Result<HeartbeatReply> Store::heartbeat(int64_t build_id, int attempt, int64_t lease_ms) {
  if (lease_ms <= 0) return invalid("lease_ms", "lease_ms must be positive");
  return impl_->write([&](Db& db) -> Result<HeartbeatReply> {
    // An explicit transaction, so a failure after the UPDATE ran (e.g. at COMMIT) undoes it
    // instead of leaving the statement to commit silently when it is reset.
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    HeartbeatReply reply;
    {
      Result<Query> q = db.query(
          "UPDATE builds SET lease_expires_ms = ? WHERE id = ? AND attempt = ? "
          "AND status = 'running' RETURNING lease_expires_ms, cancel_requested");
      if (!q) return q.error();
      q->bind(1, impl_->now_ms() + lease_ms).bind(2, build_id).bind(3, attempt);
      Result<bool> row = q->step();
      if (!row) return row.error();
      if (!*row) return detail::fence_error(db, build_id, attempt, "heartbeat");
      reply = HeartbeatReply{q->i64(0), q->i64(1) != 0};
      if (Status s = q->run(); !s) return s.error();
    }
    if (Status s = txn->commit(); !s) return s.error();
    return reply;
  });
}

Result<Build> Store::finish(int64_t build_id, int attempt, const FinishRequest& request) {
  if (!is_terminal(request.status)) {
    return invalid("status", "finish needs a terminal status, got " + std::string(to_string(request.status)));
  }
  if (!reason_fits(request.status, request.reason)) {
    return invalid("reason", "reason " + std::string(to_string(request.reason)) + " does not fit status " +
                                 std::string(to_string(request.status)));
  }
  return impl_->write([&](Db& db) -> Result<Build> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    {
      Result<Query> q = db.query(
          "UPDATE builds SET status = ?, outcome = ?, finished_ms = ?, lease_owner = NULL, "
          "lease_expires_ms = NULL, result_branch = ?, result_diff = ?, error_message = ? "
          "WHERE id = ? AND attempt = ? AND status = 'running'");
      if (!q) return q.error();
      q->bind(1, to_string(request.status)).bind(2, to_string(request.reason)).bind(3, now);
      q->bind(4, request.result_branch).bind(5, request.result_diff).bind(6, request.error_message);
      q->bind(7, build_id).bind(8, attempt);
      if (Status s = q->run(); !s) return s.error();
    }
    if (db.changes() == 0) return detail::fence_error(db, build_id, attempt, "finish");
    if (request.metrics) {
      const BuildMetrics& m = *request.metrics;
      Result<Query> q = db.query(
          "UPDATE build_metrics SET tokens_prefilled = ?, tokens_cached = ?, tokens_generated = ?, "
          "tokens_reasoning = ?, steps = ?, tool_calls_json = ?, seconds_setup = ?, "
          "seconds_prefill = ?, seconds_decode = ?, seconds_tools = ?, seconds_verify = ?, "
          "seconds_wall = ?, seconds_model_wait = ? WHERE build_id = ?");
      if (!q) return q.error();
      q->bind(1, m.tokens_prefilled).bind(2, m.tokens_cached).bind(3, m.tokens_generated);
      q->bind(4, m.tokens_reasoning).bind(5, m.steps).bind(6, detail::metrics_tool_calls_json(m.tool_calls));
      q->bind(7, m.seconds_setup).bind(8, m.seconds_prefill).bind(9, m.seconds_decode);
      q->bind(10, m.seconds_tools).bind(11, m.seconds_verify).bind(12, m.seconds_wall);
      q->bind(13, m.seconds_model_wait).bind(14, build_id);
      if (Status s = q->run(); !s) return s.error();
    }
    return commit_transition(*impl_, db, *txn, build_id, now, /*include_diff=*/true);
  });
}

Result<CancelReply> Store::cancel(int64_t build_id) {
  return impl_->write([&](Db& db) -> Result<CancelReply> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    Result<Build> build = detail::load_build(db, build_id, /*include_diff=*/false);
    if (!build) return build.error();
    if (is_terminal(build->status)) {
      return Error{ErrorCode::conflict,
                   "build " + std::to_string(build_id) + " is already " +
                       std::string(to_string(build->status)) + "; nothing to cancel",
                   ""};
    }
    if (build->status == BuildStatus::running && build->cancel_requested) {
      return CancelReply{std::move(*build), false};  // asked before; nothing new to write
    }
    bool immediate = build->status == BuildStatus::queued;
    Result<Query> q =
        db.query(immediate ? "UPDATE builds SET status = 'cancelled', outcome = 'cancelled', "
                             "finished_ms = ? WHERE id = ? AND status = 'queued'"
                           : "UPDATE builds SET cancel_requested = 1 WHERE id = ? AND status = 'running'");
    if (!q) return q.error();
    if (immediate)
      q->bind(1, now).bind(2, build_id);
    else
      q->bind(1, build_id);
    if (Status s = q->run(); !s) return s.error();
    Result<Build> after = commit_transition(*impl_, db, *txn, build_id, now);
    if (!after) return after.error();
    return CancelReply{std::move(*after), immediate};
  });
}

Result<Build> Store::release(int64_t build_id, int attempt) {
  return impl_->write([&](Db& db) -> Result<Build> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    {
      Result<Query> q = db.query(
          "UPDATE builds SET "
          "status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END, "
          "outcome = CASE WHEN cancel_requested THEN 'cancelled' ELSE NULL END, "
          "finished_ms = CASE WHEN cancel_requested THEN ?1 ELSE NULL END, "
          "queued_ms = ?1, released = released + 1, lease_owner = NULL, lease_expires_ms = NULL "
          "WHERE id = ?2 AND attempt = ?3 AND status = 'running'");
      if (!q) return q.error();
      if (Status s = q->bind(1, now).bind(2, build_id).bind(3, attempt).run(); !s) return s.error();
    }
    if (db.changes() == 0) return detail::fence_error(db, build_id, attempt, "release");
    return commit_transition(*impl_, db, *txn, build_id, now);
  });
}

Result<RecoveryReport> Store::recover() {
  return impl_->write([&](Db& db) -> Result<RecoveryReport> {
    int64_t now = impl_->now_ms();
    Result<WriteTxn> txn = WriteTxn::begin(db);
    if (!txn) return txn.error();
    struct Expired {
      int64_t id;
      int attempt;
      bool cancel_requested;
    };
    std::vector<Expired> expired;
    {
      Result<Query> q = db.query(
          "SELECT id, attempt - released, cancel_requested FROM builds "
          "WHERE status = 'running' AND lease_expires_ms < ? ORDER BY id");
      if (!q) return q.error();
      q->bind(1, now);
      while (true) {
        Result<bool> row = q->step();
        if (!row) return row.error();
        if (!*row) break;
        expired.push_back({q->i64(0), static_cast<int>(q->i64(1)), q->i64(2) != 0});
      }
    }
    RecoveryReport report;
    std::vector<std::pair<int64_t, std::pair<int64_t, bool>>> events;  // id -> (seq, terminal)
    for (const Expired& e : expired) {
      const char* sql = nullptr;
      if (e.cancel_requested) {
        sql =
            "UPDATE builds SET status = 'cancelled', outcome = 'cancelled', "
            "finished_ms = ?1, lease_owner = NULL, lease_expires_ms = NULL WHERE id = ?2";
        ++report.cancelled;
      } else if (e.attempt >= impl_->options.max_attempts) {
        sql =
            "UPDATE builds SET status = 'error', outcome = 'infra_error', "
            "finished_ms = ?1, lease_owner = NULL, lease_expires_ms = NULL, "
            "error_message = 'lease expired on ' || (attempt - released) || ' attempts; giving up' "
            "WHERE id = ?2";
        ++report.errored;
      } else {
        sql =
            "UPDATE builds SET status = 'queued', queued_ms = ?1, lease_owner = NULL, "
            "lease_expires_ms = NULL WHERE id = ?2";
        ++report.requeued;
      }
      Result<Query> q = db.query(sql);
      if (!q) return q.error();
      if (Status s = q->bind(1, now).bind(2, e.id).run(); !s) return s.error();
      Result<Build> build = detail::load_build(db, e.id, false);
      if (!build) return build.error();
      Result<int64_t> seq = detail::insert_status_event(db, *build, now);
      if (!seq) return seq.error();
      events.push_back({e.id, {*seq, is_terminal(build->status)}});
    }
    if (Status s = txn->commit(); !s) return s.error();
    for (const auto& [id, ev] : events) impl_->notifier->on_event(id, ev.first, ev.second);
    if (report.requeued > 0) impl_->notifier->on_work();
    return report;
  });
}

}  // namespace kiln::store
