// The RAII layer over SQLite connections; see sqlite_db.h.
#include "store/sqlite_db.h"

#include <sqlite3.h>

#include <atomic>
#include <mutex>

namespace kiln::store {
std::string_view sqlite_version() { return sqlite3_libversion(); }
}  // namespace kiln::store

namespace kiln::store::detail {
namespace {

// The hook is rarely set (tests only), so the fast path is one relaxed atomic load.
std::atomic<bool> g_fault_enabled{false};
std::mutex g_fault_mu;
StepFaultHook g_fault_hook;  // guarded by g_fault_mu

int injected_fault() {
  if (!g_fault_enabled.load(std::memory_order_relaxed)) return SQLITE_OK;
  std::lock_guard lock(g_fault_mu);
  return g_fault_hook ? g_fault_hook() : SQLITE_OK;
}

// The first words of a statement, to name it in error messages without dumping all of it.
std::string statement_head(sqlite3_stmt* stmt) {
  const char* sql = sqlite3_sql(stmt);
  std::string head = sql ? sql : "?";
  size_t start = head.find_first_not_of(" \n\t");
  head = start == std::string::npos ? head : head.substr(start);
  if (head.size() > 48) head = head.substr(0, 48) + "...";
  for (char& c : head) {
    if (c == '\n') c = ' ';
  }
  return head;
}

}  // namespace

void set_step_fault_hook(StepFaultHook hook) {
  std::lock_guard lock(g_fault_mu);
  g_fault_hook = std::move(hook);
  g_fault_enabled.store(static_cast<bool>(g_fault_hook));
}

ErrorCode error_code_for(int rc) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return ErrorCode::busy;
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return ErrorCode::io;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return ErrorCode::corrupt;
    default:
      return ErrorCode::internal;
  }
}

// ---- Query ----------------------------------------------------------------------------------

Query::~Query() {
  if (stmt_) {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
}

Query& Query::bind(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}
Query& Query::bind(int index, double value) {
  sqlite3_bind_double(stmt_, index, value);
  return *this;
}
Query& Query::bind(int index, std::string_view value) {
  sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  return *this;
}
Query& Query::bind_null(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}
Query& Query::bind(int index, const std::optional<std::string>& value) {
  return value ? bind(index, std::string_view(*value)) : bind_null(index);
}
Query& Query::bind(int index, const std::optional<int64_t>& value) {
  return value ? bind(index, *value) : bind_null(index);
}

Result<bool> Query::step() {
  int rc = injected_fault();
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->error(rc, statement_head(stmt_));
}

Status Query::run() {
  while (true) {
    Result<bool> row = step();
    if (!row) return row.error();
    if (!*row) return {};
  }
}

bool Query::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
int64_t Query::i64(int col) const { return sqlite3_column_int64(stmt_, col); }
double Query::f64(int col) const { return sqlite3_column_double(stmt_, col); }
std::string Query::text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}
std::optional<std::string> Query::opt_text(int col) const {
  if (is_null(col)) return std::nullopt;
  return text(col);
}
std::optional<int64_t> Query::opt_i64(int col) const {
  if (is_null(col)) return std::nullopt;
  return i64(col);
}

// ---- Db -------------------------------------------------------------------------------------

Result<std::unique_ptr<Db>> Db::open(const std::string& path, int busy_timeout_ms, bool read_only) {
  sqlite3* handle = nullptr;
  // Readers open read-write (WAL readers may need to write the -shm index) but set query_only.
  int flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_READWRITE | (read_only ? 0 : SQLITE_OPEN_CREATE);
  int rc = sqlite3_open_v2(path.c_str(), &handle, flags, nullptr);
  std::unique_ptr<Db> db(new Db(handle, path));
  if (rc != SQLITE_OK) {
    return Error{
        error_code_for(rc),
        "cannot open database " + path + ": " + (handle ? sqlite3_errmsg(handle) : sqlite3_errstr(rc)), ""};
  }
  sqlite3_extended_result_codes(handle, 1);
  sqlite3_busy_timeout(handle, busy_timeout_ms);
  // WAL: readers never block the writer; NORMAL: a commit survives a process crash (not
  // necessarily a power cut), which is the durability the queue promises.
  const char* pragmas = read_only ? "PRAGMA foreign_keys=ON; PRAGMA query_only=1;"
                                  : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                                    "PRAGMA foreign_keys=ON;";
  if (Status s = db->exec_script(pragmas); !s) return s.error();
  return db;
}

Db::~Db() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close_v2(handle_);
}

Result<Query> Db::query(std::string_view sql) {
  std::string key(sql);
  auto it = statements_.find(key);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(handle_, key.data(), static_cast<int>(key.size()), SQLITE_PREPARE_PERSISTENT,
                                &stmt, nullptr);
    if (rc != SQLITE_OK) return error(rc, "prepare " + key.substr(0, 48));
    it = statements_.emplace(std::move(key), stmt).first;
  }
  return Query(this, it->second);
}

Status Db::exec(std::string_view sql) {
  Result<Query> q = query(sql);
  if (!q) return q.error();
  return q->run();
}

Status Db::exec_script(const std::string& sql) {
  char* message = nullptr;
  int rc = sqlite3_exec(handle_, sql.c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return {};
  std::string text = message ? message : sqlite3_errstr(rc);
  sqlite3_free(message);
  return Error{error_code_for(rc), "sqlite on " + path_ + ": " + text, ""};
}

int64_t Db::changes() const { return sqlite3_changes64(handle_); }
int64_t Db::last_insert_rowid() const { return sqlite3_last_insert_rowid(handle_); }
bool Db::in_transaction() const { return sqlite3_get_autocommit(handle_) == 0; }

void Db::rollback_if_open() {
  // SQLite may already have rolled back on its own (e.g. after an IOERR).
  if (in_transaction()) sqlite3_exec(handle_, "ROLLBACK", nullptr, nullptr, nullptr);
}

Error Db::error(int rc, std::string_view what) const {
  // The connection's message describes the last real failure; an injected fault never ran.
  std::string detail = sqlite3_errcode(handle_) == rc ? sqlite3_errmsg(handle_) : sqlite3_errstr(rc);
  std::string hint;
  if (error_code_for(rc) == ErrorCode::busy) hint = " (another writer held the lock past the busy timeout)";
  return Error{error_code_for(rc), "sqlite on " + path_ + ": " + std::string(what) + ": " + detail + hint,
               ""};
}

// ---- WriteTxn -------------------------------------------------------------------------------

Result<WriteTxn> WriteTxn::begin(Db& db) {
  if (Status s = db.exec("BEGIN IMMEDIATE"); !s) return s.error();
  return WriteTxn(&db);
}

WriteTxn::~WriteTxn() {
  if (db_) db_->rollback_if_open();
}

Status WriteTxn::commit() {
  Status s = db_->exec("COMMIT");
  if (s) db_ = nullptr;
  return s;
}

}  // namespace kiln::store::detail
