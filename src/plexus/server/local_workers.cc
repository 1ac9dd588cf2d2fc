#include "plexus/server/local_workers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"

namespace plexus {

absl::Status LocalWorkers::Start() {
  if (access(options_.worker_binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("worker binary not found: ", options_.worker_binary));
  }
  if (!options_.secret.has_value()) {
    return absl::FailedPreconditionError(
        "local workers need the cluster secret to register");
  }
  std::vector<std::string> env =
      EnvironmentWith(kClusterSecretEnv, options_.secret->ToHex());
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
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
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    pids_.push_back(pid);
    SPDLOG_INFO("started worker process {} for host{}", pid, h);
  }
  return absl::OkStatus();
}

absl::Status LocalWorkers::Stop() {
  if (pids_.empty()) return absl::OkStatus();
  for (pid_t pid : pids_) kill(pid, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  std::vector<std::string> unclean;
  for (size_t h = 0; h < pids_.size(); ++h) {
    const pid_t pid = pids_[h];
    bool killed = false;
    if (!WaitForExit(pid,
                     std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
      kill(pid, SIGKILL);
      killed = true;
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) continue;  // not ours any more
    if (ExitedCleanly(status)) continue;
    unclean.push_back(absl::StrCat("worker host", h, " (pid ", pid, ") ",
                                   killed
                                       ? "did not stop within 3s and was killed"
                                       : DescribeExit(status)));
    SPDLOG_ERROR("{}", unclean.back());
  }
  pids_.clear();
  if (unclean.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(unclean, "\n"));
}

}  // namespace plexus
