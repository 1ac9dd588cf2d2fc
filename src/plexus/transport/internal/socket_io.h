// Blocking stream-socket I/O for the data plane: an owning descriptor, whole
// reads and writes (EINTR and short transfers handled, no SIGPIPE), passing a
// descriptor over a unix socket, and listen/connect for TCP and abstract unix
// names. Errors are Unavailable and name the call and the errno text.
//
// Thread-compatible: at most one reader and one writer per socket at a time.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"

namespace plexus::transport::internal {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Unavailable("<what>: <strerror(err)>").
absl::Status IoError(absl::string_view what, int err);

// Writes all of `iov` (modified in place). When `pass_fd` >= 0 it travels as
// SCM_RIGHTS with the first byte (unix sockets only).
absl::Status SendAll(int fd, struct iovec* iov, int iovcnt, int pass_fd = -1);

// Reads exactly `n` bytes. Sets `*eof` (when given) if the peer closed the
// stream before the first byte; that is still an error.
absl::Status RecvAll(int fd, void* data, size_t n, bool* eof = nullptr);

// Like RecvAll, and also takes a descriptor passed with these bytes into
// `*passed` (extra descriptors are closed). Unix sockets only.
absl::Status RecvAllWithFd(int fd, void* data, size_t n, UniqueFd* passed,
                           bool* eof);

// One read of at most `n` bytes (recvmsg; EINTR retried): the count read,
// 0 at the end of the stream; DeadlineExceeded when SO_RCVTIMEO passed with
// none. When `passed` is given (unix sockets), a descriptor that came with
// these bytes is taken into it (extras, and any beyond an already valid
// one, are closed); without it the kernel closes any that came.
absl::StatusOr<size_t> RecvSome(int fd, void* data, size_t n,
                                UniqueFd* passed = nullptr);

// Blocks until `fd` has bytes to read, an end of stream or an error (a
// shutdown wakes it). No timeout: for idle connections between frames.
// A blocking recv would save this call, but on a unix socket the kernel
// also wakes a thread blocked in recv each time the peer reads what this
// end wrote (its write-space wake-up goes to every waiter; poll's waits
// are woken only for the events they asked for), and the recv sleeps
// again: one context switch for nothing per request answered
// (docs/PERFORMANCE.md, "Blocking round trip"). Frame readers poll.
absl::Status WaitReadable(int fd);
// Every later read on `fd` fails with DeadlineExceeded when no byte
// arrives for `timeout` (SO_RCVTIMEO).
absl::Status SetRecvTimeout(int fd, absl::Duration timeout);

// Reads and drops `n` bytes (to stay in step with the peer's framing).
absl::Status Discard(int fd, size_t n);

// Listens on `where`: "host" (or a bare IPv6 address, or "[v6]") on an
// ephemeral port, "host:port" or "[v6]:port" on that port. `*address`
// becomes the bound "host:port" ("[v6]:port" for IPv6).
absl::StatusOr<UniqueFd> ListenTcp(const std::string& where,
                                   std::string* address);
// Listens on the abstract unix socket `name` (no file in the filesystem).
absl::StatusOr<UniqueFd> ListenUnix(const std::string& name);
// Accepts one connection; TCP connections get TCP_NODELAY.
absl::StatusOr<UniqueFd> Accept(int listen_fd);

// Connects to "host:port" (or "[v6]:port") with TCP_NODELAY; Unavailable
// if no connection is made within `timeout` (a peer that drops packets).
// `timeout` is measured on `clock`.
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& address,
                                    absl::Duration timeout = absl::Seconds(10),
                                    Clock* clock = Clock::Real());
// Connects to the abstract unix socket `name`.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& name);

// "10.0.0.2:41234", "unix" or "?" — for log lines.
std::string PeerName(int fd);

}  // namespace plexus::transport::internal
