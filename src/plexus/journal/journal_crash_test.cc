// A real crash: a child process (journal_crash_child) appends to a journal
// and reports each durable seq over a pipe; the test SIGKILLs it in the
// middle of the stream and reopens the journal.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "plexus/common/spawn.h"
#include "plexus/journal/journal.h"
#include "plexus/journal/journal_crash_child.h"

namespace plexus::journal {
namespace {

// The journal at `path`, opened with the default options.
absl::StatusOr<std::unique_ptr<Journal>> OpenAt(const std::string& path,
                                                Replay* replay) {
  JournalOptions options;
  options.path = path;
  return Journal::Open(options, replay);
}

std::string ChildBinary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
          "journal_crash_child")
      .string();
}

// Starts the child on `path` (whose journal ends at record `start`), reads
// durable seqs until one reaches `kill_at`, SIGKILLs the child and returns
// the highest seq it reported.
uint64_t RunAndKill(const std::string& path, uint64_t start, uint64_t kill_at) {
  int fds[2];
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
  SpawnOptions options;
  options.argv = {ChildBinary(), path};
  options.pass_fds = {{fds[1], 3}};
  absl::StatusOr<pid_t> pid = SpawnChild(options);
  close(fds[1]);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return 0;
  FILE* in = fdopen(fds[0], "r");
  uint64_t reported = start;
  char line[64];
  while (reported < kill_at && std::fgets(line, sizeof line, in) != nullptr) {
    uint64_t seq = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &seq))
        << line;
    EXPECT_EQ(seq, reported + 1) << "durable seqs are reported in order";
    reported = seq;
  }
  kill(*pid, SIGKILL);
  int status = 0;
  EXPECT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the child ended by itself (status " << status << ") after "
      << reported;
  std::fclose(in);
  return reported;
}

TEST(JournalCrashTest, EveryRecordReportedDurableSurvivesASigkill) {
  char tmpl[] = "/tmp/journal_crash.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/journal.db";
  uint64_t last = 0;  // the journal's last record, as replayed
  // Three lives: each child resumes the journal the last one left.
  for (int life = 1; life <= 3; ++life) {
    const uint64_t durable = RunAndKill(path, last, last + 2000);
    ASSERT_GE(durable, last + 2000) << "life " << life;
    Replay replay;
    absl::StatusOr<std::unique_ptr<Journal>> j = OpenAt(path, &replay);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_TRUE(replay.tail.ok()) << replay.tail;
    ASSERT_GE(replay.records.size(), durable) << "life " << life;
    for (size_t i = 0; i < replay.records.size(); ++i) {
      const JournalRecord& r = replay.records[i];
      ASSERT_EQ(r.seq, i + 1);
      ASSERT_EQ(r.type, CrashRecordType(r.seq));
      ASSERT_EQ(r.payload, CrashPayload(r.seq));
    }
    last = replay.records.size();
  }
  std::filesystem::remove_all(tmpl);
}

// Opens the journal at `path` and checks that every record replayed is the
// one appended under its seq; returns how many there were.
size_t ReplayAndCheck(const std::string& path) {
  Replay replay;
  absl::StatusOr<std::unique_ptr<Journal>> j = OpenAt(path, &replay);
  EXPECT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(replay.tail.ok()) << replay.tail;
  for (size_t i = 0; i < replay.records.size(); ++i) {
    const JournalRecord& r = replay.records[i];
    EXPECT_EQ(r.seq, i + 1);
    EXPECT_EQ(r.payload, CrashPayload(r.seq)) << "record " << r.seq;
  }
  return replay.records.size();
}

// The disk loses or garbles the end of the write-ahead log (a torn write at
// power loss). The journal is left as a crash leaves it: copied while open,
// after 200 records durable in groups of 20 (SQLite has not checkpointed the
// log, which it does at 1000 frames, so its last frame is the last commit's).
// SQLite's frame checksums drop the torn commit whole, and the replay is the
// journal up to the commit before it.
TEST(JournalCrashTest, ATornWriteAheadLogEndsAtItsLastWholeCommit) {
  char tmpl[] = "/tmp/journal_torn.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path root = tmpl;
  const std::string path = (root / "journal.db").string();
  {
    Replay replay;
    absl::StatusOr<std::unique_ptr<Journal>> j = OpenAt(path, &replay);
    ASSERT_TRUE(j.ok()) << j.status();
    for (uint64_t seq = 1; seq <= 200; ++seq) {
      ASSERT_EQ(*(*j)->Append(CrashRecordType(seq), CrashPayload(seq)), seq);
      if (seq % 20 == 0) {
        ASSERT_TRUE((*j)->AwaitDurable(seq, absl::InfiniteFuture()).ok());
      }
    }
    const uintmax_t wal_size = std::filesystem::file_size(path + "-wal");
    for (const char* damage : {"pristine", "truncated", "garbled"}) {
      std::filesystem::create_directory(root / damage);
      const std::string copy = (root / damage / "journal.db").string();
      std::filesystem::copy_file(path, copy);
      std::filesystem::copy_file(path + "-wal", copy + "-wal");
      if (std::string(damage) == "truncated") {
        std::filesystem::resize_file(copy + "-wal", wal_size - 2000);
      } else if (std::string(damage) == "garbled") {
        FILE* f = std::fopen((copy + "-wal").c_str(), "r+b");
        ASSERT_NE(f, nullptr);
        std::fseek(f, -2000, SEEK_END);
        const std::string garbage(2000, '\xab');
        std::fwrite(garbage.data(), 1, garbage.size(), f);
        std::fclose(f);
      }
    }
  }
  EXPECT_EQ(ReplayAndCheck((root / "pristine/journal.db").string()), 200u);
  // The last commit holds some of records 181..200 (180 was durable before
  // 181 was appended): it is lost, and nothing before it.
  const size_t truncated =
      ReplayAndCheck((root / "truncated/journal.db").string());
  EXPECT_GE(truncated, 180u);
  EXPECT_LT(truncated, 200u);
  EXPECT_EQ(ReplayAndCheck((root / "garbled/journal.db").string()), truncated);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace plexus::journal
