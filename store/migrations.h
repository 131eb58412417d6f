// Internal to store/: the numbered schema migrations, kept in the source.
// Invariants: migration N is applied only on top of N-1, each in its own transaction together
// with the update of schema_version; a released migration is never edited, only followed.
#pragma once

#include "store/sqlite_db.h"

namespace kiln::store::detail {

// The newest schema version this binary knows.
int latest_schema_version();

// The version recorded in the file (0 for a new, empty file).
Result<int> schema_version(Db& db);

// Applies migrations up to `target` (latest_schema_version() by default). A file newer than
// this binary is refused with ErrorCode::schema_too_new and left untouched.
Status migrate(Db& db, int target = -1);

}  // namespace kiln::store::detail
