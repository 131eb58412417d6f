// The schema, as a list of numbered migrations. Read this file for the table definitions.
#include "store/migrations.h"

#include <string>
#include <vector>

namespace kiln::store::detail {
namespace {

struct Migration {
  int version;
  const char* what;
  const char* sql;
};

// Times are integer milliseconds since the Unix epoch. Status and outcome are their
// to_string() names; the CHECKs make a terminal status and finished_ms/outcome inseparable,
// and a running build always carries a lease.
const Migration kMigrations[] = {
    {1, "builds and their event log", R"sql(
CREATE TABLE builds (
  id               INTEGER PRIMARY KEY AUTOINCREMENT,
  repo             TEXT NOT NULL,
  ref              TEXT NOT NULL,
  task             TEXT NOT NULL,
  verify           TEXT,
  model            TEXT NOT NULL,
  task_key         TEXT NOT NULL,
  priority         INTEGER NOT NULL DEFAULT 0,
  max_steps        INTEGER NOT NULL DEFAULT 0 CHECK (max_steps >= 0),
  max_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (max_tokens >= 0),
  max_wall_s       INTEGER NOT NULL DEFAULT 0 CHECK (max_wall_s >= 0),
  status           TEXT NOT NULL CHECK (status IN
                     ('queued','running','succeeded','failed','cancelled','error')),
  outcome          TEXT CHECK (outcome IN ('verified','verify_failed','no_verify','step_limit',
                     'token_limit','time_limit','cancelled','infra_error','model_error')),
  attempt          INTEGER NOT NULL DEFAULT 0,
  lease_owner      TEXT,
  lease_expires_ms INTEGER,
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  created_ms       INTEGER NOT NULL,
  queued_ms        INTEGER NOT NULL,
  started_ms       INTEGER,
  finished_ms      INTEGER,
  result_branch    TEXT,
  result_diff      TEXT,
  error_message    TEXT,
  CHECK ((status IN ('succeeded','failed','cancelled','error')) = (finished_ms IS NOT NULL)),
  CHECK ((status IN ('succeeded','failed','cancelled','error')) = (outcome IS NOT NULL)),
  CHECK ((status = 'running') = (lease_owner IS NOT NULL AND lease_expires_ms IS NOT NULL))
);
CREATE INDEX builds_claim ON builds(status, priority DESC, created_ms, id);
CREATE INDEX builds_model ON builds(model, id);
CREATE INDEX builds_lease ON builds(status, lease_expires_ms);

CREATE TABLE build_events (
  build_id     INTEGER NOT NULL REFERENCES builds(id) ON DELETE CASCADE,
  seq          INTEGER NOT NULL CHECK (seq >= 1),
  attempt      INTEGER NOT NULL,
  ts_ms        INTEGER NOT NULL,
  kind         TEXT NOT NULL,
  payload_json TEXT NOT NULL,
  PRIMARY KEY (build_id, seq)
) WITHOUT ROWID;
)sql"},
    {2, "per-build metrics and the comparison index", R"sql(
CREATE TABLE build_metrics (
  build_id          INTEGER PRIMARY KEY REFERENCES builds(id) ON DELETE CASCADE,
  tokens_prefilled  INTEGER NOT NULL DEFAULT 0,
  tokens_cached     INTEGER NOT NULL DEFAULT 0,
  tokens_generated  INTEGER NOT NULL DEFAULT 0,
  tokens_reasoning  INTEGER NOT NULL DEFAULT 0,
  steps             INTEGER NOT NULL DEFAULT 0,
  tool_calls_json   TEXT NOT NULL DEFAULT '{}',
  seconds_queue     REAL NOT NULL DEFAULT 0,
  seconds_setup     REAL NOT NULL DEFAULT 0,
  seconds_prefill   REAL NOT NULL DEFAULT 0,
  seconds_decode    REAL NOT NULL DEFAULT 0,
  seconds_tools     REAL NOT NULL DEFAULT 0,
  seconds_verify    REAL NOT NULL DEFAULT 0,
  seconds_wall      REAL NOT NULL DEFAULT 0
);
-- Builds created before this migration get an empty metrics row.
INSERT INTO build_metrics(build_id) SELECT id FROM builds;
CREATE INDEX builds_task_model ON builds(task_key, model, finished_ms);
)sql"},
    {3, "attempts handed back at shutdown (not counted toward max_attempts)", R"sql(
ALTER TABLE builds ADD COLUMN released INTEGER NOT NULL DEFAULT 0 CHECK (released >= 0);
)sql"},
    {4, "time spent waiting for the model (load, a free engine session)", R"sql(
ALTER TABLE build_metrics ADD COLUMN seconds_model_wait REAL NOT NULL DEFAULT 0;
)sql"},
};

}  // namespace

int latest_schema_version() { return kMigrations[std::size(kMigrations) - 1].version; }

Result<int> schema_version(Db& db) {
  if (Status s = db.exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"); !s) {
    return s.error();
  }
  Result<Query> q = db.query("SELECT MAX(version) FROM schema_version");
  if (!q) return q.error();
  Result<bool> row = q->step();
  if (!row) return row.error();
  return (*row && !q->is_null(0)) ? static_cast<int>(q->i64(0)) : 0;
}

Status migrate(Db& db, int target) {
  if (target < 0) target = latest_schema_version();
  // The version check and the migrations run under one write lock, so two processes opening
  // an old file at once cannot both apply a migration.
  Result<WriteTxn> txn = WriteTxn::begin(db);
  if (!txn) return txn.error();
  Result<int> current = schema_version(db);
  if (!current) return current.error();
  if (*current > latest_schema_version()) {
    return Error{ErrorCode::schema_too_new,
                 "database " + db.path() + " has schema version " + std::to_string(*current) +
                     " but this kiln knows only up to " + std::to_string(latest_schema_version()) +
                     "; run a newer kiln or point --db at another file",
                 ""};
  }
  for (const Migration& m : kMigrations) {
    if (m.version <= *current || m.version > target) continue;
    if (Status s = db.exec_script(m.sql); !s) {
      return Error{s.error().code,
                   "migration " + std::to_string(m.version) + " (" + m.what + "): " + s.error().message, ""};
    }
    Result<Query> q = db.query("INSERT INTO schema_version(version) VALUES (?)");
    if (!q) return q.error();
    if (Status s = q->bind(1, m.version).run(); !s) return s;
  }
  return txn->commit();
}

}  // namespace kiln::store::detail
