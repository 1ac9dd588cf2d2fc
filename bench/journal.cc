// plexus-bench-journal: the journal's write rate on this machine's disk,
// with real fsync, for each embedded store it could use (SQLite in WAL mode,
// LevelDB), and through the Journal's group commit.
//
//   build/bin/plexus-bench-journal [--benchmark_format=json ...]
//
// Store/<backend>/<group>: one commit of <group> records of 200 bytes
// (plus the 18-byte header) per iteration, synced: appends/s and syncs/s.
// Journal/<threads>: appenders that each append and wait until durable
// (a client batch acknowledged once durable); group commit forms the batches:
// appends/s, syncs/s and records per sync.
// Files go to $PLEXUS_BENCH_DIR (default: the current directory), which
// must be on the disk being measured (not a tmpfs).
#include "plexus/journal/journal.h"

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/journal/internal/leveldb_store.h"
#include "plexus/journal/internal/record.h"
#include "plexus/journal/internal/sqlite_store.h"

namespace plexus::journal {
namespace {

constexpr size_t kRecordBytes = 200;

std::string BenchDir(const std::string& name) {
  const char* root = std::getenv("PLEXUS_BENCH_DIR");
  std::filesystem::path dir =
      std::filesystem::absolute(root ? root : ".") /
      absl::StrCat("journal-bench-", getpid(), "-", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

using OpenStore = absl::StatusOr<std::unique_ptr<internal::JournalStore>> (*)(
    const std::string&);

void BM_Store(benchmark::State& state, OpenStore open, const char* name) {
  const std::string dir = BenchDir(name);
  {
    auto store = open(dir + "/journal");
    if (!store.ok()) {
      state.SkipWithError(store.status().ToString().c_str());
      return;
    }
    const int64_t group = state.range(0);
    const std::string payload(kRecordBytes, 'r');
    uint64_t seq = 0;
    std::vector<internal::StoredRecord> batch(group);
    for (auto _ : state) {
      for (auto& r : batch) {
        ++seq;
        r = {seq, internal::EncodeRecord(seq, 1, payload)};
      }
      absl::Status s = (*store)->Write(batch);
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        break;
      }
    }
    state.counters["appends_per_s"] = benchmark::Counter(
        static_cast<double>(seq), benchmark::Counter::kIsRate);
    state.counters["syncs_per_s"] = benchmark::Counter(
        static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  }
  std::filesystem::remove_all(dir);
}

BENCHMARK_CAPTURE(BM_Store, sqlite_wal, &internal::OpenSqliteStore, "sqlite")
    ->Arg(1)
    ->Arg(16)
    ->Arg(128)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Store, leveldb, &internal::OpenLevelDbStore, "leveldb")
    ->Arg(1)
    ->Arg(16)
    ->Arg(128)
    ->UseRealTime()
    ->MinTime(2.0);

// The Journal itself (SQLite), shared by the benchmark's threads.
Journal* g_journal = nullptr;
std::string g_journal_dir;
JournalStats g_before;

void BM_Journal(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_journal_dir = BenchDir("journal");
    JournalOptions options;
    options.path = g_journal_dir + "/journal.db";
    Replay replay;
    g_journal = Journal::Open(options, &replay)->release();
    g_before = g_journal->stats();
  }
  // The threads start their loops together, after thread 0's set-up.
  const std::string payload(kRecordBytes, 'r');
  for (auto _ : state) {
    absl::StatusOr<uint64_t> seq = g_journal->Append(1, payload);
    absl::Status s = seq.ok()
                         ? g_journal->AwaitDurable(*seq, absl::InfiniteFuture())
                         : seq.status();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  state.counters["appends_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  if (state.thread_index() == 0) {
    JournalStats after = g_journal->stats();
    const double syncs =
        static_cast<double>(after.synced_batches - g_before.synced_batches);
    state.counters["syncs_per_s"] =
        benchmark::Counter(syncs, benchmark::Counter::kIsRate);
    state.counters["records_per_sync"] =
        static_cast<double>(after.appended - g_before.appended) / syncs;
    // Every thread has left its loop (the benchmark's end barrier).
    delete g_journal;
    g_journal = nullptr;
    std::filesystem::remove_all(g_journal_dir);
  }
}
BENCHMARK(BM_Journal)->ThreadRange(1, 64)->UseRealTime()->MinTime(2.0);

}  // namespace
}  // namespace plexus::journal

BENCHMARK_MAIN();
