// Internal to store/: a thin RAII layer over one SQLite connection.
// Db owns a sqlite3* and a cache of prepared statements; Query borrows one cached statement and
// resets it when it goes out of scope. A Db is used by one thread at a time (the Store's writer
// mutex or reader pool guarantees that); SQLite itself runs in multi-thread mode.
//
// Fault injection (tests only): set_step_fault_hook installs a function called before every
// sqlite3_step this layer makes (except ROLLBACK); returning a nonzero SQLite code makes the step
// fail with that code without running it. This drives the error paths (BUSY, IOERR) in tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "store/store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace kiln::store::detail {

using StepFaultHook = std::function<int()>;
void set_step_fault_hook(StepFaultHook hook);  // empty function = no faults

class Db;

class Query {
 public:
  Query(Db* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Query(Query&& other) noexcept : db_(other.db_), stmt_(other.stmt_) { other.stmt_ = nullptr; }
  Query& operator=(Query&&) = delete;
  ~Query();

  // Parameters are 1-based, as in SQLite.
  Query& bind(int index, int64_t value);
  Query& bind(int index, int value) { return bind(index, static_cast<int64_t>(value)); }
  Query& bind(int index, double value);
  Query& bind(int index, std::string_view value);  // copied (SQLITE_TRANSIENT)
  Query& bind(int index, const std::string& value) { return bind(index, std::string_view(value)); }
  Query& bind(int index, const char* value) { return bind(index, std::string_view(value)); }
  Query& bind_null(int index);
  Query& bind(int index, const std::optional<std::string>& value);
  Query& bind(int index, const std::optional<int64_t>& value);

  // true: a row is ready; false: done. Errors name the statement's first words and the file.
  Result<bool> step();
  // Steps until done; for statements that return nothing.
  Status run();

  // Columns are 0-based.
  bool is_null(int col) const;
  int64_t i64(int col) const;
  double f64(int col) const;
  std::string text(int col) const;
  std::optional<std::string> opt_text(int col) const;
  std::optional<int64_t> opt_i64(int col) const;

 private:
  Db* db_;
  sqlite3_stmt* stmt_;
};

class Db {
 public:
  // Opens (creating when !read_only) `path` and applies the connection pragmas.
  static Result<std::unique_ptr<Db>> open(const std::string& path, int busy_timeout_ms, bool read_only);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // A cached prepared statement, reset and unbound. sql must be one statement.
  Result<Query> query(std::string_view sql);
  // Runs one statement with no parameters and no result rows.
  Status exec(std::string_view sql);
  // Runs a script of several statements (migrations); no fault injection, no caching.
  Status exec_script(const std::string& sql);

  int64_t changes() const;
  int64_t last_insert_rowid() const;
  bool in_transaction() const;
  // Ends an open transaction, if any, by rolling it back. Never fault-injected: it is the
  // recovery path itself. Used by WriteTxn and before a reader goes back to the pool.
  void rollback_if_open();
  const std::string& path() const { return path_; }

  // An Error for SQLite code `rc` while doing `what`, with SQLite's message and the file name.
  Error error(int rc, std::string_view what) const;

 private:
  friend class Query;
  friend class WriteTxn;
  Db(sqlite3* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  sqlite3* handle_;
  std::string path_;
  std::unordered_map<std::string, sqlite3_stmt*> statements_;
};

// BEGIN IMMEDIATE ... COMMIT; rolls back in the destructor unless committed.
class WriteTxn {
 public:
  static Result<WriteTxn> begin(Db& db);
  WriteTxn(WriteTxn&& other) noexcept : db_(other.db_) { other.db_ = nullptr; }
  WriteTxn& operator=(WriteTxn&&) = delete;
  ~WriteTxn();
  Status commit();

 private:
  explicit WriteTxn(Db* db) : db_(db) {}
  Db* db_;
};

// Maps an SQLite result code to the store's ErrorCode.
ErrorCode error_code_for(int rc);

}  // namespace kiln::store::detail
