#include "plexus/transport/internal/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace plexus::transport::internal {
namespace {

// Room for a few descriptors, so that a peer sending more than one cannot
// make us lose track of them (MSG_CTRUNC); the extras are closed.
constexpr int kMaxPassedFds = 4;

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Fills `addr` with the abstract name: sun_path[0] = '\0', then the name.
absl::StatusOr<socklen_t> AbstractAddress(const std::string& name,
                                          sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr->sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket name '", name, "' must have 1 to ",
                     sizeof(addr->sun_path) - 1, " characters"));
  }
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                name.size());
}

// Splits "host:port" or "[v6]:port".
absl::Status SplitHostPort(const std::string& address, std::string* host,
                           std::string* port) {
  size_t colon = address.rfind(':');
  int port_number = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port_number) ||
      port_number <= 0 || port_number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane address '", address, "' is not of the form host:port"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = address.substr(colon + 1);
  return absl::OkStatus();
}

std::string FormatAddress(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(in6->sin6_port));
  }
  if (sa->sa_family == AF_UNIX) return "unix";
  return "?";
}

// connect(2) that ends by `timeout` on `clock`: non-blocking, then poll for the
// outcome (EINTR-safe: the attempt goes on in the kernel meanwhile). A peer
// that silently drops the SYN would otherwise hold the caller for the
// kernel's retries, about two minutes.
int ConnectWithin(int fd, const sockaddr* addr, socklen_t len,
                  absl::Duration timeout, Clock* clock) {
  if (timeout == absl::InfiniteDuration()) {
    if (connect(fd, addr, len) == 0) return 0;
    if (errno != EINTR) return -1;
    // Interrupted: the attempt goes on in the kernel; wait for its end.
    pollfd p{fd, POLLOUT, 0};
    while (poll(&p, 1, -1) < 0) {
      if (errno != EINTR) return -1;
    }
    int err = 0;
    socklen_t err_len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) return -1;
    errno = err;
    return err == 0 ? 0 : -1;
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -1;
  if (connect(fd, addr, len) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) return -1;
    const absl::Time deadline = clock->Now() + timeout;
    pollfd p{fd, POLLOUT, 0};
    while (true) {
      const int64_t left_ms = std::max<int64_t>(
          0, absl::ToInt64Milliseconds(deadline - clock->Now()));
      const int ready =
          poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
      if (ready > 0) break;
      if (ready == 0) {
        errno = ETIMEDOUT;
        return -1;
      }
      if (errno != EINTR) return -1;
    }
    int err = 0;
    socklen_t err_len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) return -1;
    if (err != 0) {
      errno = err;
      return -1;
    }
  }
  return fcntl(fd, F_SETFL, flags) < 0 ? -1 : 0;
}

}  // namespace

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::Status IoError(absl::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

absl::Status SendAll(int fd, struct iovec* iov, int iovcnt, int pass_fd) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = iovcnt;
    if (pass_fd >= 0) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &pass_fd, sizeof(int));
    }
    ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return IoError("send", errno);
    }
    pass_fd = -1;  // attached to the bytes just sent
    auto left = static_cast<size_t>(sent);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status WaitReadable(int fd) {
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, -1) < 0) {
    if (errno != EINTR) return IoError("poll", errno);
  }
  return absl::OkStatus();
}

absl::Status SetRecvTimeout(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
    return IoError("setsockopt(SO_RCVTIMEO)", errno);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t n, bool* eof) {
  return RecvAllWithFd(fd, data, n, nullptr, eof);
}

absl::StatusOr<size_t> RecvSome(int fd, void* data, size_t n,
                                UniqueFd* passed) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  while (true) {
    iovec iov{data, n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (passed != nullptr) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    ssize_t got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError(
            "recv: no byte within the receive timeout");
      }
      return IoError("recv", errno);
    }
    if (passed != nullptr) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
           c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          if (!passed->valid()) {
            passed->Reset(received);
          } else {
            close(received);
          }
        }
      }
      if (msg.msg_flags & MSG_CTRUNC) {
        return absl::UnavailableError("recv: passed descriptors truncated");
      }
    }
    return static_cast<size_t>(got);
  }
}

absl::Status RecvAllWithFd(int fd, void* data, size_t n, UniqueFd* passed,
                           bool* eof) {
  if (eof != nullptr) *eof = false;
  auto* out = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    absl::StatusOr<size_t> got = RecvSome(fd, out + done, n - done, passed);
    if (!got.ok()) {
      if (absl::IsDeadlineExceeded(got.status())) {
        // SO_RCVTIMEO passed with no byte of the rest of the frame.
        return absl::DeadlineExceededError(
            absl::StrCat("recv: the peer stopped sending after ", done, " of ",
                         n, " bytes"));
      }
      return got.status();
    }
    if (*got == 0) {
      if (eof != nullptr && done == 0) *eof = true;
      return absl::UnavailableError(absl::StrCat(
          "recv: connection closed by peer after ", done, " of ", n, " bytes"));
    }
    done += *got;
  }
  return absl::OkStatus();
}

absl::Status Discard(int fd, size_t n) {
  std::vector<char> scratch(std::min<size_t>(n, size_t{64} << 10));
  while (n > 0) {
    size_t step = std::min(n, scratch.size());
    if (absl::Status s = RecvAll(fd, scratch.data(), step); !s.ok()) return s;
    n -= step;
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ListenTcp(const std::string& where,
                                   std::string* address) {
  // "host", "[v6]" or a bare v6 address (more than one colon): any free
  // port; "host:port" or "[v6]:port": that port.
  std::string host = where, port = "0";
  if (where.size() >= 2 && where.front() == '[' && where.back() == ']') {
    host = where.substr(1, where.size() - 2);
  } else if (!where.empty() &&
             (where.front() == '[' ||
              std::count(where.begin(), where.end(), ':') == 1)) {
    // As SplitHostPort, but port 0 (any free port) is allowed here.
    const size_t colon = where.rfind(':');
    int number = -1;
    if (colon == 0 || !absl::SimpleAtoi(where.substr(colon + 1), &number) ||
        number < 0 || number > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plane listen address '", where,
                       "' is not of the form host, host:port or [v6]:port"));
    }
    host = where.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    port = absl::StrCat(number);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data plane: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = IoError("socket", errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    // A fixed port is taken again at once by a restarted worker, though
    // connections of the last one linger in TIME_WAIT (Linux still refuses
    // a second listener).
    const int one = 1;
    if (port != "0") {
      setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = IoError(absl::StrCat("bind ", where), errno);
    } else if (listen(fd.get(), SOMAXCONN) != 0) {
      last = IoError("listen", errno);
    } else if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound),
                           &len) != 0) {
      last = IoError("getsockname", errno);
    } else {
      freeaddrinfo(result);
      *address = FormatAddress(reinterpret_cast<sockaddr*>(&bound));
      return fd;
    }
  }
  freeaddrinfo(result);
  return last;
}

namespace {
// A unix stream socket and the abstract address `name`.
absl::StatusOr<UniqueFd> UnixSocket(const std::string& name, sockaddr_un* addr,
                                    socklen_t* len) {
  absl::StatusOr<socklen_t> l = AbstractAddress(name, addr);
  if (!l.ok()) return l.status();
  *len = *l;
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return IoError("socket(AF_UNIX)", errno);
  return fd;
}
}  // namespace

absl::StatusOr<UniqueFd> ListenUnix(const std::string& name) {
  sockaddr_un addr;
  socklen_t len;
  absl::StatusOr<UniqueFd> fd = UnixSocket(name, &addr, &len);
  if (!fd.ok()) return fd.status();
  if (bind(fd->get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return IoError(absl::StrCat("bind unix '@", name, "'"), errno);
  }
  if (listen(fd->get(), SOMAXCONN) != 0) return IoError("listen", errno);
  return fd;
}

absl::StatusOr<UniqueFd> Accept(int listen_fd) {
  while (true) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
          addr.ss_family != AF_UNIX) {
        SetNoDelay(fd);
      }
      return UniqueFd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return IoError("accept", errno);
  }
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& address,
                                    absl::Duration timeout, Clock* clock) {
  std::string host, port;
  if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("data plane: cannot resolve '",
                                               host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = IoError("socket", errno);
      continue;
    }
    if (ConnectWithin(fd.get(), ai->ai_addr, ai->ai_addrlen, timeout, clock) !=
        0) {
      last = errno == ETIMEDOUT
                 ? absl::UnavailableError(
                       absl::StrCat("connect ", address, ": no answer within ",
                                    absl::FormatDuration(timeout)))
                 : IoError(absl::StrCat("connect ", address), errno);
      continue;
    }
    freeaddrinfo(result);
    SetNoDelay(fd.get());
    return fd;
  }
  freeaddrinfo(result);
  return last;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& name) {
  sockaddr_un addr;
  socklen_t len;
  absl::StatusOr<UniqueFd> fd = UnixSocket(name, &addr, &len);
  if (!fd.ok()) return fd.status();
  // Blocking: a unix socket answers at once or says why (a non-blocking
  // connect would fail with EAGAIN on a full backlog instead of waiting).
  if (ConnectWithin(fd->get(), reinterpret_cast<sockaddr*>(&addr), len,
                    absl::InfiniteDuration(), Clock::Real()) != 0) {
    return IoError(absl::StrCat("connect unix '@", name, "'"), errno);
  }
  return fd;
}

std::string PeerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return "?";
  }
  return FormatAddress(reinterpret_cast<sockaddr*>(&addr));
}

}  // namespace plexus::transport::internal
