#include "plexus/client/embedded_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "plexus/client/client.h"
#include "plexus/common/process.h"
#include "plexus/common/spawn.h"

namespace plexus {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedCluster>> EmbeddedCluster::Start(
    const EmbeddedClusterOptions& options) {
  const std::string server = SiblingBinary("plexus-server");
  if (access(server.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "plexus-server not found next to this benchmark: ", server));
  }
  absl::StatusOr<ClusterSecret> secret = ClusterSecret::Generate();
  if (!secret.ok()) return secret.status();
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "plexus-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  std::unique_ptr<EmbeddedCluster> cluster(
      new EmbeddedCluster(options, tmpl, *secret));
  const std::string log_file = tmpl + "/server.log";
  // The server writes its address to this pipe once it listens and every
  // worker has registered; the read end also sees EOF if it dies first.
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  constexpr int kReadyFd = 3;  // where the child finds the write end

  std::vector<std::string> args = {server,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--ready-fd",
                                   std::to_string(kReadyFd),
                                   "--local-workers",
                                   std::to_string(options.hosts),
                                   "--devices-per-host",
                                   std::to_string(options.devices_per_host),
                                   "--device-memory-mib",
                                   std::to_string(options.device_memory_mib),
                                   "--log-level",
                                   options.log_level,
                                   "--die-with-parent"};
  if (!options.shared_memory) args.push_back("--no-shm");
  if (!options.journal_path.empty()) {
    args.push_back("--journal");
    args.push_back(options.journal_path);
  }
  // Own process group, so that Stop() can reach the workers too; dies with
  // the benchmark even if it is killed before its destructor runs.
  absl::StatusOr<pid_t> pid =
      SpawnChild({.argv = std::move(args),
                  .env = EnvironmentWith(kClusterSecretEnv, secret->ToHex()),
                  .die_with_parent = true,
                  .log_file = log_file,
                  .new_process_group = true,
                  .pass_fds = {{ready[1], kReadyFd}}});
  if (!pid.ok()) {
    close(ready[0]);
    close(ready[1]);
    return pid.status();
  }
  cluster->pid_ = *pid;
  close(ready[1]);

  cluster->ready_fd_ = ready[0];  // Stop() reads the rest

  pollfd pfd{ready[0], POLLIN, 0};
  const int waited =
      poll(&pfd, 1, absl::ToInt64Milliseconds(options.start_timeout));
  char line[256] = {0};
  const ssize_t got = waited > 0 ? read(ready[0], line, sizeof(line) - 1) : 0;
  std::string address(line, got > 0 ? got : 0);
  while (!address.empty() && std::isspace(address.back())) address.pop_back();
  if (address.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        waited == 0 ? "the embedded cluster did not come up within "
                    : "plexus-server exited while starting, within ",
        absl::FormatDuration(options.start_timeout), " (", options.hosts,
        " workers); its log ends with:\n", cluster->LogTail()));
  }
  cluster->address_ = address;
  return cluster;
}

EmbeddedCluster::~EmbeddedCluster() {
  absl::Status stopped = Stop();
  if (!stopped.ok()) {
    std::fprintf(stderr, "plexus: embedded cluster: %s\n",
                 std::string(stopped.message()).c_str());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::StatusOr<proto::ClusterStatus> EmbeddedCluster::Status() const {
  return GetClusterStatus(address_);
}

absl::Status EmbeddedCluster::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  const bool exited = WaitForExit(pid_, absl::Seconds(5));
  // Whatever of the group is left (a server that would not stop, or a
  // worker that outlived it) goes now. The group id stays reserved while
  // any member lives, so this cannot reach an unrelated process.
  kill(-pid_, SIGKILL);
  int wait_status = 0;
  const bool reaped = waitpid(pid_, &wait_status, 0) == pid_;
  pid_ = -1;
  // The server is gone, so the pipe ends: what it said about its workers.
  std::string report;
  if (ready_fd_ >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(ready_fd_, buf, sizeof(buf))) > 0 ||
           (n < 0 && errno == EINTR)) {
      if (n > 0) report.append(buf, n);
    }
    close(ready_fd_);
    ready_fd_ = -1;
    // (Start() read the address line already.)
    while (!report.empty() && std::isspace(report.back())) report.pop_back();
  }
  if (exited && reaped && ExitedCleanly(wait_status) && report.empty()) {
    return absl::OkStatus();
  }
  std::string message = absl::StrCat(
      "plexus-server (", address_, ") ",
      !exited ? "did not stop within 5s and was killed"
              : (reaped ? DescribeExit(wait_status) : "could not be reaped"));
  if (!report.empty()) absl::StrAppend(&message, "\n", report);
  return absl::InternalError(message);
}

std::string EmbeddedCluster::LogTail() const {
  std::string log = ReadFile(dir_ + "/server.log");
  constexpr size_t kTail = 2000;
  if (log.size() > kTail) log = "..." + log.substr(log.size() - kTail);
  return log;
}

}  // namespace plexus
