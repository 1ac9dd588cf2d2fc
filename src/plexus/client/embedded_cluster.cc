#include "plexus/client/embedded_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "plexus/client/client.h"

namespace plexus {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int AliveWorkers(const proto::ClusterStatus& status) {
  int alive = 0;
  for (const auto& w : status.workers()) alive += w.alive() ? 1 : 0;
  return alive;
}

}  // namespace

std::string SiblingPath(const std::string& name) {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::unique_ptr<EmbeddedCluster>> EmbeddedCluster::Start(
    const EmbeddedClusterOptions& options) {
  const std::string server = SiblingPath("plexus-server");
  if (access(server.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "plexus-server not found next to this benchmark: ", server));
  }
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "plexus-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  std::unique_ptr<EmbeddedCluster> cluster(new EmbeddedCluster(options, tmpl));
  const std::string address_file = tmpl + "/address";
  const std::string log_file = tmpl + "/server.log";

  std::vector<std::string> args = {server,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--address-file",
                                   address_file,
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
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0)
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Own process group, so that Stop() can reach the workers too; die with
    // the benchmark even if it is killed before its destructor runs.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null_fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with the child's own call
  cluster->pid_ = pid;

  // Wait with a deadline: first for the address file (written, then renamed
  // into place, once the server accepts connections), then for the workers.
  const absl::Time deadline = absl::Now() + options.start_timeout;
  absl::Duration delay = absl::Milliseconds(2);
  auto backoff = [&delay] {
    absl::SleepFor(delay);  // polling a child process: nothing to wait on
    delay = std::min(delay * 2, absl::Milliseconds(100));
  };
  auto exited = [&]() -> absl::Status {
    int wstatus = 0;
    if (waitpid(cluster->pid_, &wstatus, WNOHANG) == cluster->pid_) {
      cluster->pid_ = -1;
      return absl::InternalError(
          absl::StrCat("plexus-server exited while starting (status ", wstatus,
                       "); its log ends with:\n", cluster->LogTail()));
    }
    return absl::OkStatus();
  };
  while (true) {
    if (absl::Status s = exited(); !s.ok()) return s;
    std::string address = ReadFile(address_file);
    while (!address.empty() && std::isspace(address.back())) address.pop_back();
    if (!address.empty()) {
      cluster->address_ = address;
      break;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("plexus-server did not write its address within ",
                       absl::FormatDuration(options.start_timeout),
                       "; its log ends with:\n", cluster->LogTail()));
    }
    backoff();
  }
  delay = absl::Milliseconds(2);
  while (true) {
    if (absl::Status s = exited(); !s.ok()) return s;
    auto status = GetClusterStatus(cluster->address_);
    if (status.ok() && AliveWorkers(*status) >= options.hosts) break;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the embedded cluster did not have ", options.hosts,
          " live workers within ", absl::FormatDuration(options.start_timeout),
          " (",
          status.ok() ? absl::StrCat(AliveWorkers(*status), " alive")
                      : std::string(status.status().message()),
          "); the server log ends with:\n", cluster->LogTail()));
    }
    backoff();
  }
  return cluster;
}

EmbeddedCluster::~EmbeddedCluster() {
  Stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::StatusOr<proto::ClusterStatus> EmbeddedCluster::Status() const {
  return GetClusterStatus(address_);
}

void EmbeddedCluster::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool reaped = false;
  while (!reaped && absl::Now() < deadline) {
    reaped = waitpid(pid_, nullptr, WNOHANG) == pid_;
    if (!reaped) absl::SleepFor(absl::Milliseconds(5));  // no fd to wait on
  }
  // Whatever of the group is left (a server that would not stop, or a
  // worker that outlived it) goes now. The group id stays reserved while
  // any member lives, so this cannot reach an unrelated process.
  kill(-pid_, SIGKILL);
  if (!reaped) waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string EmbeddedCluster::LogTail() const {
  std::string log = ReadFile(dir_ + "/server.log");
  constexpr size_t kTail = 2000;
  if (log.size() > kTail) log = "..." + log.substr(log.size() - kTail);
  return log;
}

}  // namespace plexus
