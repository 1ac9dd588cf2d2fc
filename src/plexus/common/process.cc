#include "plexus/common/process.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

extern char** environ;

namespace plexus {

std::string LocalMachineId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  struct stat net;
  const uint64_t net_inode =
      stat("/proc/self/ns/net", &net) == 0 ? net.st_ino : 0;
  return absl::StrCat(host, "/", id, "/net:", net_inode);
}

std::string SiblingBinary(const std::string& name) {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  return absl::StrCat(dir, "/", name);
}

std::vector<std::string> EnvironmentWith(const std::string& name,
                                         const std::string& value) {
  const std::string prefix = name + "=";
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, prefix)) env.emplace_back(*e);
  }
  env.push_back(prefix + value);
  return env;
}

void UseLockOrderChecksOfThisBuild() {
#ifdef PLEXUS_CHECK_LOCK_ORDER
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
#else
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

void RaiseOpenFileLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

bool WaitForExit(int pid, absl::Duration timeout) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;  // already gone (and reaped)
  pollfd pfd{fd, POLLIN, 0};
  const int ready = poll(&pfd, 1, absl::ToInt64Milliseconds(timeout));
  close(fd);
  return ready > 0;
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    return absl::StrCat("was killed by signal ", sig, " (SIG",
                        abbrev != nullptr ? abbrev : "?", ")");
  }
  return absl::StrCat("stopped with wait status ", wait_status);
}

bool ExitedCleanly(int wait_status) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

namespace {
sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

// A thread started before main (OpenBLAS starts its pool when the library
// loads) does not block the termination signals, so the kernel delivers
// SIGTERM to it, and without a handler the default action ends the process
// (a pod deleted by Kubernetes would never shut down cleanly). The handler
// hands the signal to the watcher's thread, where sigwait takes it; one
// that comes before a watcher waits is kept for it in `g_pending`.
std::atomic<pid_t> g_watcher_tid{0};
std::atomic<int> g_pending{0};

void ForwardTerminationSignal(int sig) {
  const int saved_errno = errno;
  g_pending.store(sig);
  if (const pid_t tid = g_watcher_tid.load(); tid != 0) {
    // tgkill, not pthread_kill: async-signal-safe, and a thread that has
    // just gone is ESRCH, not undefined behaviour.
    syscall(SYS_tgkill, getpid(), tid, sig);
  }
  errno = saved_errno;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  struct sigaction forward {};
  forward.sa_handler = ForwardTerminationSignal;
  forward.sa_flags = SA_RESTART;
  sigfillset(&forward.sa_mask);
  sigaction(SIGTERM, &forward, nullptr);
  sigaction(SIGINT, &forward, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

TerminationSignalWatcher::TerminationSignalWatcher(
    std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)), thread_([this] { Loop(); }) {}

TerminationSignalWatcher::~TerminationSignalWatcher() {
  stopping_ = true;
  g_watcher_tid.store(0);
  // Wakes the thread's sigwait: SIGTERM is blocked in it, so this signal
  // waits for it there and nowhere else.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

void TerminationSignalWatcher::Loop() {
  const sigset_t signals = TerminationSignals();
  bool called = false;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  g_watcher_tid.store(tid);
  struct Unregister {
    pid_t tid;
    ~Unregister() {
      pid_t mine = tid;
      g_watcher_tid.compare_exchange_strong(mine, 0);
    }
  } unregister{tid};
  // A signal a handler took before this thread was known.
  if (const int early = g_pending.exchange(0); early != 0 && !stopping_) {
    called = true;
    on_signal_(early);
  }
  while (true) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    g_pending.store(0);  // this one, if a handler forwarded it
    if (stopping_) return;
    if (!called) {
      called = true;
      on_signal_(sig);
    }
  }
}

}  // namespace plexus
