// store_bench: how fast is the SQLite queue and event log on this machine?
// Prints submits/s, claims/s, heartbeats/s, finishes/s and event appends/s (one writer alone,
// batched, and with 4 readers tailing the log through wait_for_events), plus the command line.
//
//   store_bench [--builds N] [--events N] [--dir PATH]
//
// The database lives in a fresh directory under --dir (default: the current directory) and is
// removed at the end. Numbers include fsync behaviour of the filesystem under --dir (WAL,
// synchronous=NORMAL: no fsync per commit, so this measures SQLite and the store, not the disk).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"

namespace {

using namespace kiln::store;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what, const Error& e) {
  std::fprintf(stderr, "store_bench: %s: %s\n", what.c_str(), e.message.c_str());
  std::exit(1);
}

template <class T>
T must(Result<T> r, const char* what) {
  if (!r) die(what, r.error());
  return std::move(r).value();
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

struct Row {
  std::string what;
  long ops;
  double seconds;
  std::string note;
};

BuildSpec bench_spec(int i) {
  BuildSpec s;
  s.repo = "/srv/repos/bench";
  s.ref = "main";
  s.task = "benchmark task " + std::to_string(i);
  s.verify = "make test";
  s.model = i % 2 ? "model-a" : "model-b";
  s.limits = {100, 1'000'000, 3600};
  return s;
}

std::string event_payload(long i) {
  // About the size of a streamed model_text chunk with its JSON envelope.
  return R"({"text":"token chunk )" + std::to_string(i) + R"( lorem ipsum dolor sit amet"})";
}

}  // namespace

int main(int argc, char** argv) {
  long builds = 5000, events = 20000;
  std::string base = ".";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--builds" && i + 1 < argc)
      builds = std::atol(argv[++i]);
    else if (arg == "--events" && i + 1 < argc)
      events = std::atol(argv[++i]);
    else if (arg == "--dir" && i + 1 < argc)
      base = argv[++i];
    else {
      std::fprintf(stderr, "usage: store_bench [--builds N] [--events N] [--dir PATH]\n");
      return 2;
    }
  }
  std::string dir = (std::filesystem::path(base) / ("store_bench." + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  StoreOptions options;
  options.path = dir + "/kiln.db";
  std::unique_ptr<Store> store = must(Store::open(options), "open");
  std::vector<Row> rows;

  auto t = Clock::now();
  for (long i = 0; i < builds; ++i) must(store->submit(bench_spec(static_cast<int>(i))), "submit");
  rows.push_back({"submit", builds, seconds_since(t), "one transaction each, with its status event"});

  ClaimRequest claim;
  claim.owner = "bench";
  std::vector<Build> claimed;
  t = Clock::now();
  for (long i = 0; i < builds; ++i) {
    std::optional<Build> b = must(store->claim(claim), "claim");
    if (!b) die("claim", Error{ErrorCode::internal, "queue ran dry early", ""});
    claimed.push_back(std::move(*b));
  }
  rows.push_back(
      {"claim", builds, seconds_since(t), "priority+age order, " + std::to_string(builds) + " queued"});

  t = Clock::now();
  for (const Build& b : claimed) must(store->heartbeat(b.id, b.attempt, 60'000), "heartbeat");
  rows.push_back({"heartbeat", builds, seconds_since(t), "fenced lease renewal"});

  // Event appends, one writer, one event per transaction.
  const Build& target = claimed.front();
  t = Clock::now();
  for (long i = 0; i < events; ++i) {
    must(store->append_event(target.id, target.attempt, event_kind::model_text, event_payload(i)), "append");
  }
  rows.push_back({"event append, 1 writer", events, seconds_since(t), "one event per transaction"});

  // The same, 16 events per transaction (append_events), as a streaming agent could batch.
  const Build& batch_target = claimed[1 % claimed.size()];
  t = Clock::now();
  for (long i = 0; i < events; i += 16) {
    std::vector<NewEvent> batch;
    for (long j = i; j < std::min(events, i + 16); ++j) {
      batch.push_back({std::string(event_kind::model_text), event_payload(j)});
    }
    must(store->append_events(batch_target.id, batch_target.attempt, batch), "append_events");
  }
  rows.push_back({"event append, batches of 16", events, seconds_since(t), "append_events"});

  // One writer while 4 readers tail the same build's log through wait_for_events.
  const Build& tailed = claimed[2 % claimed.size()];
  int64_t start_seq = must(store->read_events(tailed.id, 0, 10000), "read").back().seq;
  std::atomic<bool> done{false};
  std::atomic<long> delivered{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&] {
      int64_t after = start_seq;
      while (after < start_seq + events) {
        std::vector<Event> got =
            must(store->wait_for_events(tailed.id, after, 1000, std::chrono::milliseconds(200)), "tail");
        if (!got.empty()) after = got.back().seq;
        delivered += static_cast<long>(got.size());
        if (got.empty() && done.load()) break;
      }
    });
  }
  t = Clock::now();
  for (long i = 0; i < events; ++i) {
    must(store->append_event(tailed.id, tailed.attempt, event_kind::model_text, event_payload(i)), "append");
  }
  double write_s = seconds_since(t);
  done = true;
  for (std::thread& r : readers) r.join();
  double tail_s = seconds_since(t);
  rows.push_back(
      {"event append, 4 readers tailing", events, write_s,
       "readers got " + std::to_string(delivered.load()) + "/" + std::to_string(4 * events) + " events"});
  rows.push_back({"tail delivery (4 readers)", delivered.load(), tail_s, "events delivered to readers"});

  FinishRequest finish;
  finish.reason = OutcomeReason::no_verify;
  t = Clock::now();
  for (const Build& b : claimed) must(store->finish(b.id, b.attempt, finish), "finish");
  rows.push_back({"finish", builds, seconds_since(t), "with final status event"});

  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::printf("store_bench — SQLite %s, WAL, synchronous=NORMAL; %s; %u hardware threads\n",
              std::string(sqlite_version()).c_str(), cpu_name().c_str(), std::thread::hardware_concurrency());
  std::printf("command: %s\n\n", command.c_str());
  std::printf("| %-32s | %8s | %9s | %12s | %s\n", "operation", "count", "seconds", "per second", "note");
  std::printf("|%s|%s|%s|%s|%s\n", std::string(34, '-').c_str(), std::string(10, '-').c_str(),
              std::string(11, '-').c_str(), std::string(14, '-').c_str(), "------");
  for (const Row& r : rows) {
    std::printf("| %-32s | %8ld | %9.3f | %12.0f | %s\n", r.what.c_str(), r.ops, r.seconds,
                r.seconds > 0 ? static_cast<double>(r.ops) / r.seconds : 0.0, r.note.c_str());
  }
  store.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
