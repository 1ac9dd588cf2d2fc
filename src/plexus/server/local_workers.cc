#include "plexus/server/local_workers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "plexus/common/logging.h"

namespace plexus {

std::string SiblingBinary(const std::string& name) {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string();
  dir = dir.substr(0, dir.rfind('/'));
  return absl::StrCat(dir, "/", name);
}

absl::Status LocalWorkers::Start() {
  if (access(options_.worker_binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("worker binary not found: ", options_.worker_binary));
  }
  for (int h = 0; h < options_.hosts; ++h) {
    std::vector<std::string> args = {options_.worker_binary,
                                     "--server",
                                     options_.server_address,
                                     "--devices",
                                     std::to_string(options_.devices_per_host),
                                     "--device-memory-mib",
                                     absl::StrCat(options_.device_memory_mib),
                                     "--host-name",
                                     absl::StrCat("host", h),
                                     "--log-level",
                                     options_.log_level,
                                     "--die-with-parent"};
    if (!options_.shared_memory) args.push_back("--no-shm");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the parent died already
      execv(argv[0], argv.data());
      _exit(127);
    }
    pids_.push_back(pid);
    SPDLOG_INFO("started worker process {} for host{}", pid, h);
  }
  return absl::OkStatus();
}

void LocalWorkers::Stop() {
  if (pids_.empty()) return;
  for (pid_t pid : pids_) kill(pid, SIGTERM);
  absl::Time deadline = absl::Now() + absl::Seconds(3);
  std::vector<pid_t> left = pids_;
  while (!left.empty()) {
    std::vector<pid_t> still;
    for (pid_t pid : left) {
      if (waitpid(pid, nullptr, WNOHANG) == 0) still.push_back(pid);
    }
    left.swap(still);
    if (left.empty()) break;
    if (absl::Now() > deadline) {
      for (pid_t pid : left) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      break;
    }
    absl::SleepFor(
        absl::Milliseconds(10));  // reaping children: no fd to wait on
  }
  pids_.clear();
}

}  // namespace plexus
