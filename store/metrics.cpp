// Per-build metrics: incremental deltas while a build runs (fenced by attempt). The final
// values come with finish() (queue.cpp); seconds_queue is written by claim().
#include "store/store_impl.h"

namespace kiln::store {

Status Store::add_metrics(int64_t build_id, int attempt, const BuildMetrics& d, const NewEvent* event) {
  auto negative = [](double v) { return v < 0; };
  if (d.tokens_prefilled < 0 || d.tokens_cached < 0 || d.tokens_generated < 0 || d.tokens_reasoning < 0 ||
      d.steps < 0 || negative(d.seconds_setup) || negative(d.seconds_prefill) || negative(d.seconds_decode) ||
      negative(d.seconds_tools) || negative(d.seconds_verify) || negative(d.seconds_wall) ||
      negative(d.seconds_model_wait)) {
    return Error{ErrorCode::invalid_argument, "metric deltas must not be negative", "metrics"};
  }
  if (d.seconds_queue != 0) {
    return Error{ErrorCode::invalid_argument, "seconds_queue is written by the store at claim",
                 "metrics.seconds_queue"};
  }
  for (const auto& [tool, count] : d.tool_calls) {
    if (tool.empty() || count < 0) {
      return Error{ErrorCode::invalid_argument, "tool_calls needs non-empty names and counts >= 0",
                   "metrics.tool_calls"};
    }
  }
  if (event != nullptr) {
    if (std::optional<Error> err = detail::validate_event(event->kind, event->payload_json)) return *err;
  }
  return impl_->write([&](detail::Db& db) -> Status {
    Result<detail::WriteTxn> txn = detail::WriteTxn::begin(db);
    if (!txn) return txn.error();
    std::string tool_calls_json;
    {
      // The fence and the current tool counts in one read; the merge happens here because the
      // counts are a JSON object keyed by tool name.
      Result<detail::Query> q = db.query(
          "SELECT m.tool_calls_json FROM builds b JOIN build_metrics m ON m.build_id = b.id "
          "WHERE b.id = ? AND b.attempt = ? AND b.status = 'running'");
      if (!q) return q.error();
      q->bind(1, build_id).bind(2, attempt);
      Result<bool> row = q->step();
      if (!row) return row.error();
      if (!*row) return detail::fence_error(db, build_id, attempt, "metrics update");
      tool_calls_json = q->text(0);
    }
    std::map<std::string, int64_t> tool_calls = detail::parse_tool_calls_json(tool_calls_json);
    for (const auto& [tool, count] : d.tool_calls) tool_calls[tool] += count;

    Result<detail::Query> q = db.query(
        "UPDATE build_metrics SET tokens_prefilled = tokens_prefilled + ?, "
        "tokens_cached = tokens_cached + ?, tokens_generated = tokens_generated + ?, "
        "tokens_reasoning = tokens_reasoning + ?, steps = steps + ?, tool_calls_json = ?, "
        "seconds_setup = seconds_setup + ?, seconds_prefill = seconds_prefill + ?, "
        "seconds_decode = seconds_decode + ?, seconds_tools = seconds_tools + ?, "
        "seconds_verify = seconds_verify + ?, seconds_wall = seconds_wall + ?, "
        "seconds_model_wait = seconds_model_wait + ? WHERE build_id = ?");
    if (!q) return q.error();
    q->bind(1, d.tokens_prefilled).bind(2, d.tokens_cached).bind(3, d.tokens_generated);
    q->bind(4, d.tokens_reasoning).bind(5, d.steps).bind(6, detail::metrics_tool_calls_json(tool_calls));
    q->bind(7, d.seconds_setup).bind(8, d.seconds_prefill).bind(9, d.seconds_decode);
    q->bind(10, d.seconds_tools).bind(11, d.seconds_verify).bind(12, d.seconds_wall);
    q->bind(13, d.seconds_model_wait).bind(14, build_id);
    if (Status s = q->run(); !s) return s;
    int64_t seq = 0;
    if (event != nullptr) {
      Result<int64_t> appended = detail::insert_event(db, build_id, attempt, impl_->now_ms(), event->kind, event->payload_json);
      if (!appended) return appended.error();
      seq = *appended;
    }
    if (Status s = txn->commit(); !s) return s;
    if (event != nullptr) impl_->notifier->on_event(build_id, seq, /*terminal=*/false);
    return {};
  });
}

}  // namespace kiln::store
