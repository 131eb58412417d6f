// Schema migrations (store/migrations.cpp): old files upgrade, newer files are refused.
#include <fstream>

#include "store/migrations.h"
#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

int file_schema_version(const std::string& path) {
  auto db = detail::Db::open(path, 1000, /*read_only=*/false);
  EXPECT_TRUE(db.ok());
  Result<int> v = detail::schema_version(**db);
  EXPECT_TRUE(v.ok());
  return v.ok() ? *v : -1;
}

TEST(StoreMigrations, ADatabaseCreatedByMigrationOneUpgrades) {
  TempDir dir;
  std::string path = dir.file("old.db");
  {
    auto db = detail::Db::open(path, 1000, false);
    ASSERT_OK(db);
    ASSERT_OK(detail::migrate(**db, 1));
    // A build as a version-1 kiln wrote it: no build_metrics table existed yet.
    ASSERT_OK((*db)->exec_script(
        "INSERT INTO builds(repo, ref, task, verify, model, task_key, status, created_ms, "
        "queued_ms) VALUES ('/r', 'main', 'old task', NULL, 'qwen-a', 'k1', 'queued', 5, 5);"
        "INSERT INTO build_events(build_id, seq, attempt, ts_ms, kind, payload_json) "
        "VALUES (1, 1, 0, 5, 'status', '{\"status\":\"queued\"}');"));
  }
  ASSERT_EQ(file_schema_version(path), 1);

  auto store = open_store(path);
  ASSERT_TRUE(store);
  EXPECT_EQ(file_schema_version(path), detail::latest_schema_version());
  EXPECT_GE(detail::latest_schema_version(), 2);
  Result<Build> old = store->get(1);
  ASSERT_OK(old);
  EXPECT_EQ(old->spec.task, "old task");
  EXPECT_EQ(old->metrics.tokens_generated, 0);  // the metrics row the migration backfilled
  // The upgraded build goes through the whole queue.
  Build b = **store->claim(claimer());
  EXPECT_EQ(b.id, 1);
  ASSERT_OK(store->append_event(1, b.attempt, "log", "{}"));
  EXPECT_EQ(store->read_events(1, 0)->back().seq, 3);
}

TEST(StoreMigrations, ATooNewSchemaIsRefusedAndLeftUntouched) {
  TempDir dir;
  std::string path = dir.file("new.db");
  { ASSERT_TRUE(open_store(path)); }
  {
    auto db = detail::Db::open(path, 1000, false);
    ASSERT_OK(db);
    ASSERT_OK((*db)->exec_script("INSERT INTO schema_version(version) VALUES (99)"));
  }
  StoreOptions options;
  options.path = path;
  Result<std::unique_ptr<Store>> store = Store::open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::schema_too_new);
  EXPECT_NE(store.error().message.find("99"), std::string::npos) << store.error().message;
  EXPECT_NE(store.error().message.find(path), std::string::npos) << store.error().message;
  EXPECT_EQ(file_schema_version(path), 99);
}

TEST(StoreMigrations, AFileThatIsNotADatabaseIsReportedAsCorrupt) {
  TempDir dir;
  std::string path = dir.file("junk.db");
  std::ofstream(path) << std::string(8192, 'x');
  StoreOptions options;
  options.path = path;
  Result<std::unique_ptr<Store>> store = Store::open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::corrupt) << store.error().message;
  EXPECT_NE(store.error().message.find(path), std::string::npos) << store.error().message;
}

}  // namespace
}  // namespace kiln::store
