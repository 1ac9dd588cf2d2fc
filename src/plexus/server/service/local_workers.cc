#include "plexus/server/service/local_workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/common/logging.h"
#include "plexus/common/process.h"
#include "plexus/common/spawn.h"

namespace plexus {

void RestartRateLimit::Expire(absl::Time now) const {
  while (!admitted_.empty() && admitted_.front() <= now - window_) {
    admitted_.pop_front();
  }
}

bool RestartRateLimit::Admit(absl::Time now) {
  Expire(now);
  if (static_cast<int>(admitted_.size()) >= max_) return false;
  admitted_.push_back(now);
  return true;
}

int RestartRateLimit::InWindow(absl::Time now) const {
  Expire(now);
  return static_cast<int>(admitted_.size());
}

absl::Time RestartRateLimit::NextAdmission(absl::Time now) const {
  Expire(now);
  if (static_cast<int>(admitted_.size()) < max_) return now;
  if (max_ <= 0) return absl::InfiniteFuture();
  // The event that must leave the window for one more to fit.
  return admitted_[admitted_.size() - max_] + window_;
}

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
  absl::StatusOr<pid_t> pid = SpawnChild(
      {.argv = std::move(args), .env = env_, .die_with_parent = true});
  if (!pid.ok()) return pid.status();
  SPDLOG_INFO("started worker process {} for {}{}", *pid, host_name,
              spare ? " (a spare)" : "");
  return *pid;
}

std::vector<pid_t> LocalWorkers::pids() const {
  absl::MutexLock lock(&mu_);
  return pids_;
}

void LocalWorkers::Supervise() {
  while (true) {
    std::vector<pid_t> pids;
    int timeout_ms = -1;  // no deferred replacement: until a worker exits
    {
      absl::MutexLock lock(&mu_);
      pids = pids_;
      if (!deferred_.empty()) {
        const absl::Time now = options_.clock->Now();
        const absl::Duration wait = restart_limit_.NextAdmission(now) - now;
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Milliseconds(wait) + 1, 1, 3'600'000));
      }
    }
    std::vector<pollfd> fds;
    fds.push_back({stop_fd_, POLLIN, 0});
    std::vector<int> pidfds;
    for (pid_t pid : pids) {
      const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      pidfds.push_back(fd);
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    // Sleeps until a worker exits, Stop() writes the eventfd, or the rate
    // limit lets a deferred replacement go.
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
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
    StartDeferredLocked();
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      // pids_ may have grown at its end since the copy, never shrunk.
      SPDLOG_WARN("worker {} (pid {}) {}", names_[i], pids[i],
                  DescribeExit(status));
      ReplaceLocked(i);
      break;  // the lists changed: poll again
    }
  }
}

pid_t LocalWorkers::SpawnReplacementLocked(const std::string& replaces) {
  const std::string spare_name =
      absl::StrCat("spare", options_.spares + restarts_);
  absl::StatusOr<pid_t> pid = Spawn(spare_name, /*spare=*/true);
  if (!pid.ok()) {
    SPDLOG_ERROR("cannot start a spare in the place of {}: {}", replaces,
                 pid.status().ToString());
    return 0;
  }
  restarts_++;
  SPDLOG_INFO("{} (pid {}) takes the place of {} as a spare", spare_name, *pid,
              replaces);
  names_.push_back(spare_name);
  pids_.push_back(*pid);
  return *pid;
}

void LocalWorkers::ReplaceLocked(size_t slot) {
  exits_++;
  const std::string name = names_[slot];
  pids_.erase(pids_.begin() + slot);
  names_.erase(names_.begin() + slot);
  const absl::Time now = options_.clock->Now();
  if (!restart_limit_.Admit(now)) {
    deferred_.push_back(name);
    SPDLOG_ERROR(
        "not replacing worker {} yet: {} workers were replaced in the last "
        "{} (the limit; a crash loop?); {} replacement(s) deferred, the "
        "next at {}",
        name, restart_limit_.InWindow(now),
        absl::FormatDuration(restart_limit_.window()), deferred_.size(),
        absl::FormatTime("%H:%M:%E3S", restart_limit_.NextAdmission(now),
                         absl::UTCTimeZone()));
    return;
  }
  const pid_t pid = SpawnReplacementLocked(name);
  if (pid == 0) return;
  // In the place of the one it replaces.
  pids_.insert(pids_.begin() + slot, pids_.back());
  pids_.pop_back();
  names_.insert(names_.begin() + slot, names_.back());
  names_.pop_back();
}

void LocalWorkers::StartDeferredLocked() {
  while (!deferred_.empty() && restart_limit_.Admit(options_.clock->Now())) {
    const std::string name = std::move(deferred_.front());
    deferred_.pop_front();
    SpawnReplacementLocked(absl::StrCat(name, " (deferred by the rate limit; ",
                                        deferred_.size(), " more deferred)"));
  }
}

int LocalWorkers::restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

int LocalWorkers::deferred_restarts() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(deferred_.size());
}

bool LocalWorkers::AwaitSupervisor(int exits, int restarts,
                                   absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return exits_ >= exits && restarts_ >= restarts;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
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
  const bool supervised = options_.spares > 0;
  if (pids_.empty()) return absl::OkStatus();
  for (pid_t pid : pids_) kill(pid, SIGTERM);
  // A worker finishes what it is compiling before it exits (an XLA compile
  // cannot be interrupted: seconds for the largest, more on a loaded
  // machine; a spare that just joined compiles the job's programs ahead).
  // Ends as soon as they have all exited.
  const absl::Time deadline = options_.clock->Now() + kStopGrace;
  std::vector<std::string> unclean;
  for (size_t h = 0; h < pids_.size(); ++h) {
    const pid_t pid = pids_[h];
    bool killed = false;
    if (!WaitForExit(pid, std::max(deadline - options_.clock->Now(),
                                   absl::ZeroDuration()))) {
      kill(pid, SIGKILL);
      killed = true;
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) continue;  // not ours any more
    if (ExitedCleanly(status)) continue;
    if (!killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) {
      // Died of the SIGTERM sent above by its default action: it had not
      // set up its handler yet (a replacement the supervisor had just
      // started), so it held nothing. It stopped as asked.
      SPDLOG_INFO("worker {} (pid {}) stopped while it was starting", names_[h],
                  pid);
      continue;
    }
    if (supervised && !killed && WIFSIGNALED(status) &&
        WTERMSIG(status) == SIGKILL) {
      // Killed from outside (Stop sends SIGKILL only past the grace): a
      // loss the cluster ran through, which the supervisor had not reaped
      // yet when the stop began. Logged as it would have logged it.
      SPDLOG_WARN("worker {} (pid {}) {} before the stop", names_[h], pid,
                  DescribeExit(status));
      continue;
    }
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
