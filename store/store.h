// kiln::store — the SQLite build queue, event log, metrics and model comparisons.
// This is the only header other folders include; it carries no SQLite types.
//
// A build's life (each arrow names the function that makes it; the store checks every one):
//   submit()                     -> queued
//   queued   --claim()---------> running   (attempt+1, lease owner + expiry)
//   running  --heartbeat()-----> running   (lease renewed; reports cancel_requested)
//   running  --finish()--------> succeeded | failed | cancelled | error   (fenced by attempt)
//   queued   --cancel()--------> cancelled (immediately)
//   running  --cancel()--------> running with cancel_requested (worker sees it at heartbeat)
//   running  --recover()-------> queued, or error/infra_error after max_attempts,
//                                or cancelled when a cancel was requested   (lease expired)
//   running  --release()-------> queued (a worker shutting down hands its attempt back; fenced,
//                                not counted toward max_attempts), or cancelled when one was requested
// Every transition appends a `status` event to the build's event log in the same transaction.
//
// Fencing: heartbeat, finish, append_event and add_metrics take the attempt number the worker
// got from claim(); they write only while the build is running with exactly that attempt, so a
// worker whose lease expired and whose build was claimed again gets ErrorCode::fenced and
// changes nothing.
//
// Threads: a Store is safe to use from any number of threads. Writes go through one writer
// connection (serialized by a mutex inside the Store); reads use a small pool of reader
// connections, so readers never wait for writers (WAL). Several Store objects (or processes)
// may open the same file; SQLite's locking and the busy timeout serialize their writes.
// Blocking waits (claim_wait, wait_for_work, wait_for_events) are woken by writes made through
// any Store of this process on the same file, and otherwise return at their timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kiln::store {

// ---------------------------------------------------------------------------------------------
// Errors and results.

enum class ErrorCode {
  invalid_argument,  // bad input; Error::field names the field (HTTP 400)
  not_found,         // no such build (HTTP 404)
  fenced,            // the caller's attempt no longer owns the build (lease lost or finished)
  conflict,          // the build is in a state that does not allow the operation (HTTP 409)
  busy,              // the database stayed locked past the busy timeout (retry later)
  io,                // the disk failed (SQLITE_IOERR, SQLITE_FULL, cannot open)
  corrupt,           // the file is not a kiln database or is damaged
  schema_too_new,    // the file was written by a newer kiln than this binary
  internal,          // anything else from SQLite; the message says what
};
std::string_view to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;  // names the thing at fault, e.g. "build 12: attempt 1 is fenced ..."
  std::string field;    // for invalid_argument: the input field at fault, e.g. "limits.max_steps"
};

// A value or an Error. Accessing the wrong alternative is a programming error (std::bad_variant_access).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}
  bool ok() const { return !error_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};
using Status = Result<void>;

// ---------------------------------------------------------------------------------------------
// Value types.

enum class BuildStatus { queued, running, succeeded, failed, cancelled, error };
enum class OutcomeReason {
  verified,       // the verify command passed                      (succeeded)
  verify_failed,  // the verify command failed                      (failed)
  no_verify,      // the model submitted and there was no verify    (succeeded)
  step_limit,     // budgets ran out                                 (failed)
  token_limit,
  time_limit,
  cancelled,    // a user cancelled                               (cancelled)
  infra_error,  // kiln itself failed (clone, sandbox, lost lease) (error)
  model_error,  // the model could not be loaded or ran out of memory (error)
};

std::string_view to_string(BuildStatus status);
std::string_view to_string(OutcomeReason reason);
std::optional<BuildStatus> parse_build_status(std::string_view text);
std::optional<OutcomeReason> parse_outcome_reason(std::string_view text);
bool is_terminal(BuildStatus status);
inline constexpr BuildStatus kAllStatuses[] = {BuildStatus::queued,    BuildStatus::running,
                                               BuildStatus::succeeded, BuildStatus::failed,
                                               BuildStatus::cancelled, BuildStatus::error};

// Event kinds the store and agent use; any non-empty kind of at most 64 bytes is accepted.
namespace event_kind {
inline constexpr std::string_view status = "status";  // written by the store on every transition
inline constexpr std::string_view model_text = "model_text";
inline constexpr std::string_view reasoning = "reasoning";
inline constexpr std::string_view tool_call = "tool_call";
inline constexpr std::string_view tool_result = "tool_result";
inline constexpr std::string_view log = "log";
inline constexpr std::string_view metric = "metric";
inline constexpr std::string_view error = "error";
}  // namespace event_kind

// Budgets of one build; 0 means "no limit". Negative values, and values above the bounds below, are
// refused: past them a worker's int step counter or its steady_clock deadline would overflow.
struct Limits {
  int64_t max_steps = 0;
  int64_t max_tokens = 0;
  int64_t max_wall_s = 0;
};
inline constexpr int64_t kMaxLimitSteps = 1'000'000;
inline constexpr int64_t kMaxLimitTokens = 1'000'000'000;
inline constexpr int64_t kMaxLimitWallSeconds = 10'000'000;  // ~115 days

// What a client submits. Validation errors name these fields: "repo", "ref", "task", "verify",
// "model", "limits.max_steps", "limits.max_tokens", "limits.max_wall_s", "priority".
struct BuildSpec {
  std::string repo;                   // URL or local path; required
  std::string ref;                    // branch, tag or commit; empty = the default branch
  std::string task;                   // required, not only whitespace
  std::optional<std::string> verify;  // shell command deciding success; nullopt = none
  std::string model;                  // required; must be in StoreOptions::allowed_models if set
  Limits limits;
  int64_t priority = 0;  // higher is claimed first; then oldest first
};

// Counters of one build. Token and time fields accumulate over all attempts.
struct BuildMetrics {
  int64_t tokens_prefilled = 0;
  int64_t tokens_cached = 0;  // reused from the session cache instead of prefilled
  int64_t tokens_generated = 0;
  int64_t tokens_reasoning = 0;  // the part of tokens_generated inside <think>
  int64_t steps = 0;
  std::map<std::string, int64_t> tool_calls;  // by tool name
  double seconds_queue = 0;                   // written by the store at claim (time spent queued)
  double seconds_setup = 0;                   // clone, checkout, sandbox preparation
  double seconds_prefill = 0;
  double seconds_decode = 0;
  double seconds_tools = 0;
  double seconds_verify = 0;
  double seconds_wall = 0;  // claim to finish, as the worker measured it, less seconds_model_wait
  // Waiting for the model: its load on first use and a free engine session. Server load, not the
  // build's own time, so it is kept out of seconds_setup and seconds_wall (what compare ranks).
  double seconds_model_wait = 0;

  int64_t tool_calls_total() const;
};

struct Build {
  int64_t id = 0;  // increasing: a later submit has a larger id
  BuildSpec spec;
  std::string task_key;  // task_key(spec): same repo+ref+task+verify -> same key
  BuildStatus status = BuildStatus::queued;
  std::optional<OutcomeReason> outcome;  // set exactly when status is terminal
  int attempt = 0;                       // number of claims so far
  std::optional<std::string> lease_owner;
  std::optional<int64_t> lease_expires_ms;
  bool cancel_requested = false;
  int64_t created_ms = 0;              // milliseconds since the Unix epoch, as all *_ms here
  std::optional<int64_t> started_ms;   // latest claim
  std::optional<int64_t> finished_ms;  // set exactly when status is terminal
  std::optional<std::string> result_branch;
  std::optional<std::string> result_diff;  // omitted by list() unless include_diff
  bool has_diff = false;                   // a non-empty result_diff exists, loaded or not
  std::optional<std::string> error_message;
  BuildMetrics metrics;
};

struct Event {
  int64_t build_id = 0;
  int64_t seq = 0;  // 1, 2, 3, ... per build, gapless
  int attempt = 0;  // the attempt that wrote it (0 for events written before the first claim)
  int64_t ts_ms = 0;
  std::string kind;
  std::string payload_json;  // a JSON value (usually an object)
};

// One event to append (see Store::append_events).
struct NewEvent {
  std::string kind;
  std::string payload_json;
};

struct ClaimRequest {
  std::string owner;                // who holds the lease, e.g. "host:pid/worker-3"; required
  int64_t lease_ms = 60'000;        // > 0
  std::vector<std::string> models;  // only builds for these models; empty = any model
  // When set and true, claim nothing. Read under the write lock, so a pool that raises it before
  // its workers hand their builds back (release) never sees a sibling claim one again.
  const std::atomic<bool>* stop_claiming = nullptr;
};

struct HeartbeatReply {
  int64_t lease_expires_ms = 0;
  bool cancel_requested = false;  // the worker should stop and finish(cancelled)
};

struct FinishRequest {
  BuildStatus status = BuildStatus::succeeded;     // must be terminal
  OutcomeReason reason = OutcomeReason::verified;  // must agree with status (see OutcomeReason)
  std::optional<std::string> result_branch;
  std::optional<std::string> result_diff;
  std::optional<std::string> error_message;
  // When set, replaces the build's metrics (all fields but seconds_queue, which the store owns).
  std::optional<BuildMetrics> metrics;
};

struct CancelReply {
  Build build;
  bool immediate = false;  // true: it was queued and is now cancelled; false: flag set on a running build
};

struct ListQuery {
  std::optional<BuildStatus> status;
  std::optional<std::string> model;
  int limit = 50;                 // 1..1000
  std::optional<int64_t> cursor;  // return builds with id < cursor (newest first)
  bool include_diff = false;
};

struct ListPage {
  std::vector<Build> builds;           // newest first
  std::optional<int64_t> next_cursor;  // pass as cursor for the next page; nullopt = last page
};

struct RecoveryReport {
  int64_t requeued = 0;
  int64_t errored = 0;    // exceeded max_attempts -> error / infra_error
  int64_t cancelled = 0;  // lease expired on a build whose cancel was requested
};

// For a Prometheus /metrics endpoint.
struct StoreStats {
  std::map<BuildStatus, int64_t> builds_by_status;  // every status present, 0 if none
  int64_t queue_depth = 0;                          // == builds_by_status[queued]
  int64_t tokens_prefilled = 0;                     // sums over all builds
  int64_t tokens_cached = 0;
  int64_t tokens_generated = 0;
  int64_t tokens_reasoning = 0;
};

// ---------------------------------------------------------------------------------------------
// Comparison across models on the same tasks.

struct CompareQuery {
  std::vector<std::string> models;  // empty = every model with finished builds
  // Only builds that finished at or after this time (ms since the epoch); nullopt = all time.
  std::optional<int64_t> since_ms;
};

struct ModelStats {
  std::string model;
  // Finished builds that say something about the model: cancelled builds and kiln's own failures
  // (infra_error: clone, sandbox, lost lease) are left out.
  int64_t builds = 0;
  int64_t succeeded = 0;
  // Each is nullopt (JSON null) when there is nothing to compute it from, never a made-up 0.
  std::optional<double> success_rate;             // succeeded / builds
  std::optional<double> median_wall_s;            // over succeeded builds: a model that gives up
  std::optional<double> p90_wall_s;               //   early must not look fast (nearest rank)
  std::optional<double> median_tokens_generated;  // over all its builds: what a build costs
  std::optional<double> decode_tokens_per_s;      // sum tokens_generated / sum seconds_decode
};

// Pairs use, per (task, model), the latest finished build; both succeeded/only A/only B/both failed
// are counted over tasks both models ran.
struct PairStats {
  std::string model_a;
  std::string model_b;
  int64_t tasks = 0;
  int64_t both_succeeded = 0;
  int64_t only_a = 0;
  int64_t only_b = 0;
  int64_t both_failed = 0;
  double mcnemar_p = 1.0;                   // exact two-sided, on only_a vs only_b
  std::optional<double> median_wall_ratio;  // median of wall_a / wall_b over tasks both succeeded
};

struct CompareReport {
  std::vector<ModelStats> models;  // sorted by model name
  std::vector<PairStats> pairs;    // a < b by name
};

// Exact two-sided McNemar test: p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2).
double mcnemar_exact_p(int64_t b, int64_t c);

// Stable hex key of repo + ref + task + verify (what "the same task" means for comparisons).
std::string task_key(const BuildSpec& spec);

// The SQLite library version in use, e.g. "3.40.1" (for logs and benchmarks).
std::string_view sqlite_version();

// JSON text for API layers (field names as in the structs; enums as their to_string names).
std::string to_json(const Build& build);
std::string to_json(const Event& event);
std::string to_json(const BuildMetrics& metrics);
std::string to_json(const CompareReport& report);
std::string to_json(const StoreStats& stats);

// ---------------------------------------------------------------------------------------------
// The store.

struct StoreOptions {
  std::string path = "var/kiln.db";  // its parent directory is created if missing
  int busy_timeout_ms = 5'000;
  int max_attempts = 3;  // recover() moves a build whose lease expired this many times to error
                         // (attempts handed back by release() at shutdown are not counted)
  // Models a build may name; nullopt = any model name is accepted.
  std::optional<std::set<std::string>> allowed_models;
  bool recover_on_open = true;  // run recover() once when opening
  // Clock in milliseconds since the epoch; empty = the system clock. Tests inject one.
  std::function<int64_t()> now_ms;
};

class Store {
 public:
  // Opens (creating if needed) the database, sets WAL, synchronous=NORMAL, the busy timeout and
  // foreign keys, applies pending migrations; refuses a file from a newer kiln (schema_too_new).
  static Result<std::unique_ptr<Store>> open(StoreOptions options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Validates (nothing is written on error), inserts a queued build, wakes waiting workers.
  Result<Build> submit(const BuildSpec& spec);
  // submit()'s validation alone: the first invalid field, if any.
  std::optional<Error> validate(const BuildSpec& spec) const;
  Result<Build> get(int64_t build_id, bool include_diff = true);
  Result<ListPage> list(const ListQuery& query);

  // Atomically moves the best queued build (priority desc, then oldest) to running, or returns
  // nullopt when none is eligible.
  Result<std::optional<Build>> claim(const ClaimRequest& request);
  // As claim(), but waits up to `timeout` for a submit (or requeue) when nothing is queued.
  Result<std::optional<Build>> claim_wait(const ClaimRequest& request, std::chrono::milliseconds timeout);
  // The work epoch counts submits and requeues in this process; wait_for_work returns true as
  // soon as it differs from `seen` (false at timeout or after stop_waiting()).
  uint64_t work_epoch() const;
  bool wait_for_work(uint64_t seen, std::chrono::milliseconds timeout);

  Result<HeartbeatReply> heartbeat(int64_t build_id, int attempt, int64_t lease_ms);
  Result<Build> finish(int64_t build_id, int attempt, const FinishRequest& request);
  Result<CancelReply> cancel(int64_t build_id);
  // Handles builds whose lease expired (see the state list at the top). Safe to run any time.
  // Attempts handed back by release() do not count toward max_attempts.
  Result<RecoveryReport> recover();
  // A worker shutting down gives its running attempt back at once (fenced by attempt): the build
  // is queued again (cancelled if a cancel was requested) without waiting for its lease to expire,
  // and the attempt does not count toward max_attempts.
  Result<Build> release(int64_t build_id, int attempt);

  // Appends one event with the next seq (fenced by attempt); returns the seq. The payload must
  // be valid JSON ("payload" field error otherwise).
  Result<int64_t> append_event(int64_t build_id, int attempt, std::string_view kind,
                               std::string_view payload_json);
  // Appends several events in one transaction (all or none); returns the last seq.
  Result<int64_t> append_events(int64_t build_id, int attempt, const std::vector<NewEvent>& events);
  // Events with seq > after_seq, in order, at most `limit` (1..10000). not_found if no such build.
  Result<std::vector<Event>> read_events(int64_t build_id, int64_t after_seq, int limit = 1000);
  // As read_events, but when there are none yet waits up to `timeout` for an append.
  // Returns an empty vector at timeout or after stop_waiting().
  Result<std::vector<Event>> wait_for_events(int64_t build_id, int64_t after_seq, int limit,
                                             std::chrono::milliseconds timeout);

  // Adds `delta` to the build's metrics (tool_calls merged by name). Fenced by attempt. With
  // `event`, that event is appended in the same transaction: both or neither (a worker recording
  // that it recovered a dead attempt's metrics must never add them without saying so).
  Status add_metrics(int64_t build_id, int attempt, const BuildMetrics& delta, const NewEvent* event = nullptr);

  Result<StoreStats> stats();
  Result<CompareReport> compare(const CompareQuery& query);

  // Makes every current and future blocking wait on this Store return at once (for shutdown).
  void stop_waiting();
  int64_t now_ms() const;
  const std::string& path() const;

  struct Impl;  // store/store_impl.h; public only so the implementation files can reach it

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::store
