// Reading builds: the row mapping shared by every query, get(), list() and stats().
#include <nlohmann/json.hpp>

#include "store/store_impl.h"

namespace kiln::store {
namespace detail {

std::string build_select(bool include_diff) {
  // Column order is read_build()'s; keep the two together.
  return std::string(
             "SELECT b.id, b.repo, b.ref, b.task, b.verify, b.model, b.task_key, b.priority, "
             "b.max_steps, b.max_tokens, b.max_wall_s, b.status, b.outcome, b.attempt, "
             "b.lease_owner, b.lease_expires_ms, b.cancel_requested, b.created_ms, b.started_ms, "
             "b.finished_ms, b.result_branch, ") +
         (include_diff ? "b.result_diff" : "NULL") +
         ", b.error_message, m.tokens_prefilled, m.tokens_cached, m.tokens_generated, "
         "m.tokens_reasoning, m.steps, m.tool_calls_json, m.seconds_queue, m.seconds_setup, "
         "m.seconds_prefill, m.seconds_decode, m.seconds_tools, m.seconds_verify, m.seconds_wall, "
         "b.result_diff IS NOT NULL AND b.result_diff <> '', m.seconds_model_wait "
         "FROM builds b JOIN build_metrics m ON m.build_id = b.id ";
}

Build read_build(const Query& q) {
  Build b;
  b.id = q.i64(0);
  b.spec.repo = q.text(1);
  b.spec.ref = q.text(2);
  b.spec.task = q.text(3);
  b.spec.verify = q.opt_text(4);
  b.spec.model = q.text(5);
  b.task_key = q.text(6);
  b.spec.priority = q.i64(7);
  b.spec.limits = {q.i64(8), q.i64(9), q.i64(10)};
  // The schema's CHECK constraints admit only known names, so these parses cannot fail.
  b.status = parse_build_status(q.text(11)).value_or(BuildStatus::error);
  if (auto outcome = q.opt_text(12)) b.outcome = parse_outcome_reason(*outcome);
  b.attempt = static_cast<int>(q.i64(13));
  b.lease_owner = q.opt_text(14);
  b.lease_expires_ms = q.opt_i64(15);
  b.cancel_requested = q.i64(16) != 0;
  b.created_ms = q.i64(17);
  b.started_ms = q.opt_i64(18);
  b.finished_ms = q.opt_i64(19);
  b.result_branch = q.opt_text(20);
  b.result_diff = q.opt_text(21);
  b.error_message = q.opt_text(22);
  BuildMetrics& m = b.metrics;
  m.tokens_prefilled = q.i64(23);
  m.tokens_cached = q.i64(24);
  m.tokens_generated = q.i64(25);
  m.tokens_reasoning = q.i64(26);
  m.steps = q.i64(27);
  m.tool_calls = parse_tool_calls_json(q.text(28));
  m.seconds_queue = q.f64(29);
  m.seconds_setup = q.f64(30);
  m.seconds_prefill = q.f64(31);
  m.seconds_decode = q.f64(32);
  m.seconds_tools = q.f64(33);
  m.seconds_verify = q.f64(34);
  m.seconds_wall = q.f64(35);
  b.has_diff = q.i64(36) != 0;
  m.seconds_model_wait = q.f64(37);
  return b;
}

Result<Build> load_build(Db& db, int64_t build_id, bool include_diff) {
  Result<Query> q = db.query(build_select(include_diff) + "WHERE b.id = ?");
  if (!q) return q.error();
  q->bind(1, build_id);
  Result<bool> row = q->step();
  if (!row) return row.error();
  if (!*row) {
    return Error{ErrorCode::not_found, "build " + std::to_string(build_id) + " does not exist", ""};
  }
  return read_build(*q);
}

std::string metrics_tool_calls_json(const std::map<std::string, int64_t>& tool_calls) {
  return nlohmann::json(tool_calls).dump();
}

std::map<std::string, int64_t> parse_tool_calls_json(const std::string& json) {
  std::map<std::string, int64_t> out;
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.value().is_number_integer()) out[it.key()] = it.value().get<int64_t>();
  }
  return out;
}

}  // namespace detail

Result<Build> Store::get(int64_t build_id, bool include_diff) {
  return impl_->read([&](detail::Db& db) { return detail::load_build(db, build_id, include_diff); });
}

Result<ListPage> Store::list(const ListQuery& query) {
  if (query.limit < 1 || query.limit > 1000) {
    return Error{ErrorCode::invalid_argument,
                 "limit must be between 1 and 1000, got " + std::to_string(query.limit), "limit"};
  }
  if (query.cursor && *query.cursor < 1) {
    return Error{ErrorCode::invalid_argument, "cursor must be a build id (>= 1)", "cursor"};
  }
  std::string sql = detail::build_select(query.include_diff) + "WHERE 1";
  if (query.status) sql += " AND b.status = ?1";
  if (query.model) sql += " AND b.model = ?2";
  if (query.cursor) sql += " AND b.id < ?3";
  sql += " ORDER BY b.id DESC LIMIT ?4";

  return impl_->read([&](detail::Db& db) -> Result<ListPage> {
    Result<detail::Query> q = db.query(sql);
    if (!q) return q.error();
    if (query.status) q->bind(1, to_string(*query.status));
    if (query.model) q->bind(2, *query.model);
    if (query.cursor) q->bind(3, *query.cursor);
    q->bind(4, static_cast<int64_t>(query.limit) + 1);  // one extra row tells whether more exist

    ListPage page;
    while (true) {
      Result<bool> row = q->step();
      if (!row) return row.error();
      if (!*row) break;
      page.builds.push_back(detail::read_build(*q));
    }
    if (page.builds.size() > static_cast<size_t>(query.limit)) {
      page.builds.pop_back();
      page.next_cursor = page.builds.back().id;
    }
    return page;
  });
}

Result<StoreStats> Store::stats() {
  return impl_->read([&](detail::Db& db) -> Result<StoreStats> {
    // One read transaction so the counts and the sums describe the same moment.
    if (Status s = db.exec("BEGIN"); !s) return s.error();
    struct EndRead {
      detail::Db& db;
      ~EndRead() { db.rollback_if_open(); }  // a read-only transaction: rollback just ends it
    } end_read{db};

    StoreStats stats;
    for (BuildStatus status : kAllStatuses) stats.builds_by_status[status] = 0;
    {
      Result<detail::Query> q = db.query("SELECT status, COUNT(*) FROM builds GROUP BY status");
      if (!q) return q.error();
      while (true) {
        Result<bool> row = q->step();
        if (!row) return row.error();
        if (!*row) break;
        if (auto status = parse_build_status(q->text(0))) stats.builds_by_status[*status] = q->i64(1);
      }
    }
    stats.queue_depth = stats.builds_by_status[BuildStatus::queued];
    Result<detail::Query> q = db.query(
        "SELECT TOTAL(tokens_prefilled), TOTAL(tokens_cached), TOTAL(tokens_generated), "
        "TOTAL(tokens_reasoning) FROM build_metrics");
    if (!q) return q.error();
    Result<bool> row = q->step();
    if (!row) return row.error();
    stats.tokens_prefilled = static_cast<int64_t>(q->f64(0));
    stats.tokens_cached = static_cast<int64_t>(q->f64(1));
    stats.tokens_generated = static_cast<int64_t>(q->f64(2));
    stats.tokens_reasoning = static_cast<int64_t>(q->f64(3));
    return stats;
  });
}

}  // namespace kiln::store
