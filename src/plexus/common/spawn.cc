#include "plexus/common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace plexus {
namespace {

// What the child writes to the report pipe when a step fails.
enum class Step : int { kPdeathsig, kParentGone, kDup2, kExec };
struct Report {
  Step step;
  int error;  // errno
};

// Closes every descriptor it holds when it goes out of scope.
class Descriptors {
 public:
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    for (int fd : fds_) close(fd);
  }
  int Add(int fd) {
    if (fd >= 0) fds_.push_back(fd);
    return fd;
  }

 private:
  std::vector<int> fds_;
};

absl::Status ErrnoError(absl::string_view what, int error) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(error)));
}

// In the child: async-signal-safe only. Reports the failing step on
// `report_fd` and exits.
[[noreturn]] void Fail(int report_fd, Step step, int error) {
  const Report report{step, error};
  (void)!write(report_fd, &report, sizeof(report));
  _exit(step == Step::kExec ? 127 : 1);
}

// The child's side: set-up, then exec. Never returns. Every descriptor it
// uses is numbered above every target in `dups`, so no dup2 overwrites one
// still needed.
[[noreturn]] void RunChild(const SpawnOptions& options, pid_t parent,
                           int report_fd,
                           const std::vector<std::pair<int, int>>& dups,
                           char* const* argv, char* const* envp) {
  if (options.new_process_group) setpgid(0, 0);
  if (options.die_with_parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
      Fail(report_fd, Step::kPdeathsig, errno);
    }
    if (getppid() != parent) Fail(report_fd, Step::kParentGone, 0);
  }
  for (const auto& [from, to] : dups) {
    if (dup2(from, to) < 0) Fail(report_fd, Step::kDup2, errno);
  }
  execve(argv[0], argv, envp);
  Fail(report_fd, Step::kExec, errno);
}

absl::Status ReportedError(const Report& report, const std::string& binary) {
  switch (report.step) {
    case Step::kPdeathsig:
      return ErrnoError("prctl(PR_SET_PDEATHSIG)", report.error);
    case Step::kParentGone:
      return absl::InternalError(
          "the parent exited before the child was set up");
    case Step::kDup2:
      return ErrnoError("dup2 in the child", report.error);
    case Step::kExec:
      if (report.error == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat("execve ", binary, ": ", strerror(report.error)));
      }
      return ErrnoError(absl::StrCat("execve ", binary), report.error);
  }
  return absl::InternalError("the child failed at an unknown step");
}

}  // namespace

absl::StatusOr<pid_t> SpawnChild(const SpawnOptions& options) {
  if (options.argv.empty()) {
    return absl::InvalidArgumentError("SpawnChild: no program to run");
  }
  // Everything the child touches is made here, before the fork.
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env =
      options.env.value_or(std::vector<std::string>());
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  // The child's descriptors, each copied above every target number (and
  // close-on-exec, so only the dup2'd copies reach the program).
  int floor = STDERR_FILENO + 1;
  for (const auto& [from, to] : options.pass_fds)
    floor = std::max(floor, to + 1);
  Descriptors held;
  auto above = [&](int fd) {
    return held.Add(fcntl(fd, F_DUPFD_CLOEXEC, floor));
  };
  std::vector<std::pair<int, int>> dups;
  if (!options.log_file.empty()) {
    const int log =
        held.Add(open(options.log_file.c_str(),
                      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (log < 0) {
      return ErrnoError(absl::StrCat("open log file ", options.log_file),
                        errno);
    }
    const int null = held.Add(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null < 0) return ErrnoError("open /dev/null", errno);
    const int log_fd = above(log), null_fd = above(null);
    if (log_fd < 0 || null_fd < 0) return ErrnoError("fcntl(F_DUPFD)", errno);
    dups.push_back({log_fd, STDOUT_FILENO});
    dups.push_back({log_fd, STDERR_FILENO});
    dups.push_back({null_fd, STDIN_FILENO});
  }
  for (const auto& [from, to] : options.pass_fds) {
    const int fd = above(from);
    if (fd < 0)
      return ErrnoError(absl::StrCat("fcntl(F_DUPFD) of ", from), errno);
    dups.push_back({fd, to});
  }
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
  const int report_read = held.Add(report[0]);
  // Not held: closed right after the fork, so that EOF means the exec.
  const int report_write = fcntl(report[1], F_DUPFD_CLOEXEC, floor);
  close(report[1]);
  if (report_write < 0) return ErrnoError("fcntl(F_DUPFD)", errno);

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    RunChild(options, parent, report_write, dups, argv.data(),
             options.env.has_value() ? envp.data() : environ);
  }
  const int fork_error = errno;
  close(report_write);
  if (pid < 0) return ErrnoError("fork", fork_error);
  // Also here: no race with the child's own call.
  if (options.new_process_group) setpgid(pid, pid);

  // EOF: the child exec'd (the pipe is close-on-exec). A report: it failed.
  Report got;
  ssize_t n;
  do {
    n = read(report_read, &got, sizeof(got));
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(got))) return pid;
  int ignored = 0;
  while (waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
  }
  return ReportedError(got, options.argv[0]);
}

}  // namespace plexus
