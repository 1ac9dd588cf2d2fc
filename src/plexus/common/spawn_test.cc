// SpawnChild: a child that runs, one that fails, a binary that is not
// there, the log file, a passed descriptor, the process group, and the
// parent-death signal (the spawning thread's exit kills the child).
#include "plexus/common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "plexus/common/process.h"

namespace plexus {
namespace {

int Reap(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SpawnChildTest, RunsAProgramAndTheCallerReapsIt) {
  absl::StatusOr<pid_t> pid = SpawnChild({.argv = {"/bin/true"}});
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_TRUE(ExitedCleanly(Reap(*pid)));
}

TEST(SpawnChildTest, TheChildsExitCodeIsTheCallersToRead) {
  absl::StatusOr<pid_t> pid = SpawnChild({.argv = {"/bin/sh", "-c", "exit 3"}});
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(DescribeExit(Reap(*pid)), "exited with code 3");
}

TEST(SpawnChildTest, AMissingBinaryIsNotFoundAndLeavesNoChild) {
  absl::StatusOr<pid_t> pid =
      SpawnChild({.argv = {"/nonexistent/plexus-no-such-binary"}});
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pid.status().message(),
            "execve /nonexistent/plexus-no-such-binary: No such file or "
            "directory");
  // SpawnChild reaped it: no zombie of ours is left.
  EXPECT_LE(waitpid(-1, nullptr, WNOHANG), 0);
}

TEST(SpawnChildTest, AnEmptyArgvIsRefused) {
  EXPECT_EQ(SpawnChild({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpawnChildTest, TheEnvironmentIsTheOneGiven) {
  char dir[] = "/tmp/spawn_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/child.log";
  absl::StatusOr<pid_t> pid = SpawnChild(
      {.argv = {"/bin/sh", "-c", "echo \"$PLEXUS_SPAWN_TEST\"; echo err >&2"},
       .env = EnvironmentWith("PLEXUS_SPAWN_TEST", "given"),
       .log_file = log});
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_TRUE(ExitedCleanly(Reap(*pid)));
  EXPECT_EQ(ReadAll(log), "given\nerr\n");
  unlink(log.c_str());
  rmdir(dir);
}

TEST(SpawnChildTest, ALogFileThatCannotBeOpenedIsAnError) {
  absl::StatusOr<pid_t> pid = SpawnChild(
      {.argv = {"/bin/true"}, .log_file = "/nonexistent/dir/child.log"});
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().message(),
            "open log file /nonexistent/dir/child.log: No such file or "
            "directory");
}

TEST(SpawnChildTest, APassedDescriptorReachesTheChildAtItsNumber) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  absl::StatusOr<pid_t> pid =
      SpawnChild({.argv = {"/bin/sh", "-c", "echo ready >&7"},
                  .pass_fds = {{pipe_fds[1], 7}}});
  close(pipe_fds[1]);
  ASSERT_TRUE(pid.ok()) << pid.status();
  char buf[16] = {0};
  EXPECT_EQ(read(pipe_fds[0], buf, sizeof(buf) - 1), 6);
  EXPECT_STREQ(buf, "ready\n");
  close(pipe_fds[0]);
  EXPECT_TRUE(ExitedCleanly(Reap(*pid)));
}

TEST(SpawnChildTest, ANewProcessGroupIsLedByTheChild) {
  absl::StatusOr<pid_t> pid =
      SpawnChild({.argv = {"/bin/sleep", "60"}, .new_process_group = true});
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(getpgid(*pid), *pid);
  ASSERT_EQ(kill(-*pid, SIGKILL), 0);
  const int status = Reap(*pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(SpawnChildTest, AChildThatDiesWithItsParentDiesWithTheSpawningThread) {
  // PR_SET_PDEATHSIG fires when the thread that forked exits: a thread
  // stands in for a parent that dies.
  absl::StatusOr<pid_t> pid;
  std::thread parent([&] {
    pid = SpawnChild({.argv = {"/bin/sleep", "60"}, .die_with_parent = true});
  });
  parent.join();
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int status = Reap(*pid);  // would take 60 s without the signal
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << DescribeExit(status);
}

}  // namespace
}  // namespace plexus
