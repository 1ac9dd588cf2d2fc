// A real crash: a child process (journal_crash_child) appends to a journal
// and reports each durable seq over a pipe; the test SIGKILLs it in the
// middle of the stream and reopens the journal.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "plexus/common/spawn.h"
#include "plexus/journal/journal.h"
#include "plexus/journal/journal_crash_child.h"

namespace plexus::journal {
namespace {

std::string ChildBinary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
          "journal_crash_child")
      .string();
}

// Starts the child on `path` (whose journal ends at record `start`), reads
// durable seqs until one reaches `kill_at`, SIGKILLs the child and returns
// the highest seq it reported.
uint64_t RunAndKill(const std::string& path, uint64_t start,
                    uint64_t kill_at) {
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
    JournalOptions options;
    options.path = path;
    Replay replay;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(options, &replay);
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

}  // namespace
}  // namespace plexus::journal
