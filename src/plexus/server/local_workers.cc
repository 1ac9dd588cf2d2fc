#include "plexus/server/local_workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
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
  env_ = EnvironmentWith(kClusterSecretEnv, options_.secret->ToHex());
  for (int h = 0; h < options_.hosts + options_.spares; ++h) {
    const bool spare = h >= options_.hosts;
    const std::string name = spare ? absl::StrCat("spare", h - options_.hosts)
                                   : absl::StrCat("host", h);
    absl::StatusOr<pid_t> pid = Spawn(name, spare);
    if (!pid.ok()) return pid.status();
    absl::MutexLock lock(&mu_);
    pids_.push_back(*pid);
    names_.push_back(name);
  }
  // Only a cluster with spares replaces its workers: without one a lost
  // worker stays lost, and Stop() reports how it ended.
  if (options_.spares > 0) {
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (stop_fd_ >= 0) supervisor_ = std::thread([this] { Supervise(); });
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> LocalWorkers::Spawn(const std::string& host_name,
                                          bool spare) {
  std::vector<std::string> args = {options_.worker_binary,
                                   "--server",
                                   options_.server_address,
                                   "--devices",
                                   std::to_string(options_.devices_per_host),
                                   "--device-memory-mib",
                                   absl::StrCat(options_.device_memory_mib),
                                   "--host-name",
                                   host_name,
                                   "--log-level",
                                   options_.log_level,
                                   "--die-with-parent"};
  if (!options_.shared_memory) args.push_back("--no-shm");
  if (spare) args.push_back("--spare");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_) envp.push_back(e.data());
  envp.push_back(nullptr);
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
  SPDLOG_INFO("started worker process {} for {}{}", pid, host_name,
              spare ? " (a spare)" : "");
  return pid;
}

std::vector<pid_t> LocalWorkers::pids() const {
  absl::MutexLock lock(&mu_);
  return pids_;
}

void LocalWorkers::Supervise() {
  while (true) {
    std::vector<pid_t> pids = this->pids();
    std::vector<pollfd> fds;
    fds.push_back({stop_fd_, POLLIN, 0});
    std::vector<int> pidfds;
    for (pid_t pid : pids) {
      const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      pidfds.push_back(fd);
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    // Sleeps until a worker exits or Stop() writes the eventfd.
    const int ready = poll(fds.data(), fds.size(), -1);
    for (int fd : pidfds) {
      if (fd >= 0) close(fd);
    }
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (fds[0].revents & POLLIN) != 0) return;
    absl::MutexLock lock(&mu_);
    // Stop() reaps them from now on (and this thread must outlive the
    // workers it forked: their PR_SET_PDEATHSIG fires when it exits).
    if (stopping_) {
      mu_.Await(absl::Condition(&stopped_));
      return;
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      const std::string name = names_[i];
      SPDLOG_WARN("worker {} (pid {}) {}", name, pids[i], DescribeExit(status));
      if (restarts_ >= kMaxRestarts) {
        SPDLOG_ERROR("not restarting it: {} workers restarted already",
                     restarts_);
        pids_.erase(pids_.begin() + i);
        names_.erase(names_.begin() + i);
        break;
      }
      const std::string spare_name =
          absl::StrCat("spare", options_.spares + restarts_++);
      absl::StatusOr<pid_t> pid = Spawn(spare_name, /*spare=*/true);
      if (!pid.ok()) {
        SPDLOG_ERROR("cannot start a spare in its place: {}",
                     pid.status().ToString());
        pids_.erase(pids_.begin() + i);
        names_.erase(names_.begin() + i);
        break;
      }
      SPDLOG_INFO("{} (pid {}) takes its place as a spare", spare_name, *pid);
      pids_[i] = *pid;
      names_[i] = spare_name;
      break;  // the lists changed: poll again
    }
  }
}

absl::Status LocalWorkers::Stop() {
  absl::Status result = StopWorkers();
  if (supervisor_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    supervisor_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  stop_fd_ = -1;
  return result;
}

absl::Status LocalWorkers::StopWorkers() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;  // the supervisor restarts nothing any more
  if (pids_.empty()) return absl::OkStatus();
  for (pid_t pid : pids_) kill(pid, SIGTERM);
  // A worker finishes what it is compiling before it exits (an XLA compile
  // cannot be interrupted: seconds for the largest, more on a loaded
  // machine; a spare that just joined compiles the job's programs ahead).
  // Ends as soon as they have all exited.
  const absl::Time deadline = absl::Now() + kStopGrace;
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
    unclean.push_back(absl::StrCat(
        "worker ", names_[h], " (pid ", pid, ") ",
        killed
            ? absl::StrCat("did not stop within ",
                           absl::FormatDuration(kStopGrace), " and was killed")
            : DescribeExit(status)));
    SPDLOG_ERROR("{}", unclean.back());
  }
  pids_.clear();
  names_.clear();
  if (unclean.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(unclean, "\n"));
}

}  // namespace plexus
