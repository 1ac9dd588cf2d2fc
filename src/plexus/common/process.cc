#include "plexus/common/process.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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
}  // namespace

void BlockTerminationSignals() {
  sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

TerminationSignalWatcher::TerminationSignalWatcher(
    std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)), thread_([this] { Loop(); }) {}

TerminationSignalWatcher::~TerminationSignalWatcher() {
  stopping_ = true;
  // Wakes the thread's sigwait: SIGTERM is blocked in it, so this signal
  // waits for it there and nowhere else.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

void TerminationSignalWatcher::Loop() {
  const sigset_t signals = TerminationSignals();
  bool called = false;
  while (true) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (stopping_) return;
    if (!called) {
      called = true;
      on_signal_(sig);
    }
  }
}

}  // namespace plexus
