#include "plexus/common/process.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace plexus {
namespace {

// Takes a SIGTERM or SIGINT left pending on this process, if any, so that
// the next watcher does not see it.
void DrainTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  const timespec now{0, 0};
  while (sigtimedwait(&signals, nullptr, &now) > 0) {
  }
}

TEST(TerminationSignalWatcherTest, CallsOnceAndNeverAfterItIsDestroyed) {
  BlockTerminationSignals();
  std::atomic<int> calls{0};
  absl::Notification called;
  {
    TerminationSignalWatcher watcher([&](int sig) {
      EXPECT_EQ(sig, SIGTERM);
      calls++;
      called.Notify();
    });
    kill(getpid(), SIGTERM);
    ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(20)));
    kill(getpid(), SIGINT);  // a second signal is not a second call
  }
  // The watcher's thread is joined: nothing can call back any more.
  kill(getpid(), SIGTERM);
  DrainTerminationSignals();
  EXPECT_EQ(calls.load(), 1);
}

// What the worker's main relies on: a watcher that saw no signal stops at
// once, so its owner may destroy what the callback borrows.
TEST(TerminationSignalWatcherTest, StopsWithoutASignal) {
  BlockTerminationSignals();
  DrainTerminationSignals();
  bool called = false;
  {
    TerminationSignalWatcher watcher([&](int) { called = true; });
  }
  EXPECT_FALSE(called);
}

int ExitStatusOf(void (*child)()) {
  const pid_t pid = fork();
  if (pid == 0) {
    child();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// plexus-server and plexus-worker load OpenBLAS, which starts its threads
// before main blocks the signals: the kernel delivers a SIGTERM to one of
// them. It must still reach the watcher, not end the process (Kubernetes
// deletes a pod with SIGTERM).
TEST(TerminationSignalWatcherTest, ReachesTheWatcherFromAThreadStartedFirst) {
  const int status = ExitStatusOf([] {
    std::thread library([] {
      while (true) pause();  // wakes for each signal handler it runs
    });
    library.detach();
    BlockTerminationSignals();
    absl::Notification called;
    TerminationSignalWatcher watcher([&](int sig) {
      if (sig == SIGTERM) called.Notify();
    });
    kill(getpid(), SIGTERM);  // only `library` does not block it
    _exit(called.WaitForNotificationWithTimeout(absl::Seconds(20)) ? 0 : 3);
  });
  EXPECT_TRUE(ExitedCleanly(status)) << DescribeExit(status);
}

TEST(DescribeExitTest, NamesTheCodeOrTheSignal) {
  const int clean = ExitStatusOf([] { _exit(0); });
  EXPECT_TRUE(ExitedCleanly(clean));
  EXPECT_EQ(DescribeExit(clean), "exited with code 0");
  const int code = ExitStatusOf([] { _exit(2); });
  EXPECT_FALSE(ExitedCleanly(code));
  EXPECT_EQ(DescribeExit(code), "exited with code 2");
  const int segv = ExitStatusOf([] {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  });
  EXPECT_FALSE(ExitedCleanly(segv));
  EXPECT_EQ(DescribeExit(segv), "was killed by signal 11 (SIGSEGV)");
}

// Two processes on one kernel but in different network namespaces cannot
// reach each other's abstract unix sockets: they are not the same machine
// for the data plane.
TEST(LocalMachineIdTest, DiffersInAnotherNetworkNamespace) {
  const std::string here = LocalMachineId();
  EXPECT_EQ(LocalMachineId(), here);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    std::string answer = unshare(CLONE_NEWNET) == 0
                             ? LocalMachineId()
                             : std::string("unshare: ") + strerror(errno);
    (void)!write(pipe_fds[1], answer.data(), answer.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string there;
  char buf[512];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) there.append(buf, n);
  close(pipe_fds[0]);
  waitpid(pid, nullptr, 0);
  if (there.rfind("unshare: ", 0) == 0) {
    GTEST_SKIP() << "cannot make a network namespace here (" << there << ")";
  }
  EXPECT_NE(there, here);
  // Same host name and kernel: only the namespace tells them apart.
  EXPECT_EQ(there.substr(0, there.rfind('/')), here.substr(0, here.rfind('/')));
}

}  // namespace
}  // namespace plexus
