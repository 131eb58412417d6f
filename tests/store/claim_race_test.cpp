// Claims racing across threads and connections: every build is claimed exactly once.
#include <mutex>
#include <thread>

#include "store_test_util.h"

namespace kiln::store {
namespace {

using namespace kiln::store::testing;

TEST(StoreClaimRace, EightThreadsOnTwoConnectionsClaimEachOf500BuildsExactlyOnce) {
  TempDir dir;
  std::string path = dir.file("kiln.db");
  auto first = open_store(path);
  auto second = open_store(path);  // a second Store: its own writer connection to the same file
  ASSERT_TRUE(first && second);
  constexpr int kBuilds = 500;
  std::vector<int64_t> submitted;
  for (int i = 0; i < kBuilds; ++i) submitted.push_back(first->submit(spec("task " + std::to_string(i)))->id);

  std::mutex mu;
  std::vector<int64_t> claimed;       // guarded by mu
  std::vector<std::string> failures;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      Store& store = t % 2 ? *second : *first;
      ClaimRequest request = claimer("worker-" + std::to_string(t));
      while (true) {
        Result<std::optional<Build>> c = store.claim(request);
        std::lock_guard lock(mu);
        if (!c) {
          failures.push_back(c.error().message);
          return;
        }
        if (!c->has_value()) return;
        claimed.push_back((*c)->id);
        if ((*c)->attempt != 1 || (*c)->lease_owner != request.owner) {
          failures.push_back("build " + std::to_string((*c)->id) + " has a wrong attempt or owner");
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << failures.front();
  std::sort(claimed.begin(), claimed.end());
  EXPECT_EQ(claimed, submitted);  // sorted ids: each exactly once, none missing
  Result<StoreStats> stats = first->stats();
  ASSERT_OK(stats);
  EXPECT_EQ(stats->builds_by_status.at(BuildStatus::running), kBuilds);
  EXPECT_EQ(stats->queue_depth, 0);
}

}  // namespace
}  // namespace kiln::store
