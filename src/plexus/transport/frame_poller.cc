// FramePoller: many connections' frames on one epoll thread (see the
// header).
#include "plexus/transport/frame_poller.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/common/thread_name.h"
#include "plexus/transport/internal/frame_socket.h"

namespace plexus::transport {
namespace {

using internal::CheckFrameHeader;
using internal::FrameHeader;
using internal::FrameType;
using internal::FrameTypeName;

constexpr uint64_t kWakeTag = ~uint64_t{0};  // the eventfd's epoll data

absl::Status ErrnoStatus(const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FramePoller>> FramePoller::Start(
    PolledFrames type, const char* thread_name, const char* peer) {
  std::unique_ptr<FramePoller> poller(new FramePoller(type, thread_name, peer));
  poller->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (poller->epoll_fd_ < 0) return ErrnoStatus("epoll_create1");
  poller->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (poller->wake_fd_ < 0) return ErrnoStatus("eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (epoll_ctl(poller->epoll_fd_, EPOLL_CTL_ADD, poller->wake_fd_, &ev) != 0) {
    return ErrnoStatus("epoll_ctl");
  }
  poller->thread_ = std::thread([p = poller.get()] { p->Loop(); });
  return poller;
}

FramePoller::~FramePoller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, c] : connections_) ::close(c->fd);
  connections_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

absl::Status FramePoller::Add(int64_t id, int fd, OnFrame on_frame,
                              OnEnd on_end, uint64_t generation) {
  auto c = std::make_unique<Connection>();
  c->fd = fd;
  c->generation = generation;
  c->on_frame = std::move(on_frame);
  c->on_end = std::move(on_end);
  absl::MutexLock lock(&mu_);
  if (connections_.contains(id)) {
    ::close(fd);
    return absl::AlreadyExistsError(
        absl::StrCat("connection ", id, " is polled already"));
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = static_cast<uint64_t>(id);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    const absl::Status s = ErrnoStatus("epoll_ctl");
    ::close(fd);
    return s;
  }
  connections_[id] = std::move(c);
  return absl::OkStatus();
}

void FramePoller::Remove(int64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection* c = it->second.get();
  c->removed = true;
  auto idle = [c]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !c->busy; };
  mu_.Await(absl::Condition(&idle));
  if (!c->ended) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  connections_.erase(it);
}

void FramePoller::Loop() {
  SetThreadName(thread_name_);
  // The frames of a call over many hosts arrive together: taken in as few
  // epoll_wait calls as the batch allows.
  std::vector<epoll_event> events(kEventsPerWait);
  while (true) {
    const int n = epoll_wait(epoll_fd_, events.data(),
                             static_cast<int>(events.size()), -1);
    if (n < 0 && errno != EINTR) return;  // the epoll set is gone
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        continue;
      }
      Connection* c;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        auto it = connections_.find(static_cast<int64_t>(tag));
        if (it == connections_.end()) continue;
        c = it->second.get();
        if (c->removed || c->ended) continue;
        c->busy = true;
      }
      const absl::Status read = ReadAndDeliver(*c);
      if (!read.ok()) {
        // Said once; not polled from here on (Remove closes it).
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
        bool removed;
        {
          absl::MutexLock lock(&mu_);
          c->ended = true;
          removed = c->removed;
        }
        if (!removed) c->on_end(read);
      }
      absl::MutexLock lock(&mu_);
      c->busy = false;
    }
  }
}

absl::Status FramePoller::ReadAndDeliver(Connection& c) {
  // What the socket has now, without blocking, up to the bound.
  // Into the poller's scratch block, then only the bytes read into the
  // connection's buffer (growing the buffer itself would zero-fill the
  // room each time: a 64 KiB memset per connection per wake-up).
  size_t taken = 0;
  bool eof = false;
  while (taken < kReadPerWake) {
    const ssize_t got =
        ::recv(c.fd, scratch_.data(), scratch_.size(), MSG_DONTWAIT);
    if (got > 0) {
      c.in.append(scratch_.data(), static_cast<size_t>(got));
      taken += static_cast<size_t>(got);
      // Less than asked: the socket had no more (a stream socket's recv
      // takes all it holds, up to the room). Not asked again for an
      // EAGAIN: level-triggered, epoll says so when more comes (an end
      // after these bytes too). One recv per report, not two.
      if (static_cast<size_t>(got) < scratch_.size()) break;
      continue;
    }
    if (got == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return ErrnoStatus("recv");
  }
  // Every whole frame, in order.
  size_t at = 0;
  while (c.in.size() - at >= sizeof(FrameHeader)) {
    FrameHeader header;
    std::memcpy(&header, c.in.data() + at, sizeof(header));
    if (absl::Status s = CheckFrameHeader(header, /*is_unix=*/false,
                                          /*fd_passed=*/false);
        !s.ok()) {
      return s;
    }
    const FrameType want =
        type_ == PolledFrames::kOps ? FrameType::kOps : FrameType::kReports;
    if (header.frame_type() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected ", FrameTypeName(want), " on the ops connection, got ",
          FrameTypeName(header.frame_type())));
    }
    if (c.generation == 0) c.generation = header.generation;
    if (header.generation != c.generation) {
      return absl::InvalidArgumentError(absl::StrCat(
          FrameTypeName(want), " of generation ", header.generation,
          " on a connection that carried generation ", c.generation, "'s"));
    }
    const size_t whole = sizeof(header) + header.payload_bytes;
    if (c.in.size() - at < whole) break;  // the rest comes later
    std::string message(c.in.data() + at + sizeof(header),
                        header.payload_bytes);
    at += whole;
    {
      absl::MutexLock lock(&mu_);
      if (c.removed) return absl::CancelledError("removed");
    }
    if (absl::Status s = c.on_frame(message); !s.ok()) return s;
  }
  c.in.erase(0, at);
  // A large buffer is not kept once drained (a burst of frames).
  if (c.in.empty() && c.in.capacity() > (size_t{1} << 20)) {
    std::string().swap(c.in);
  }
  if (eof) return absl::UnavailableError(absl::StrCat(peer_, " closed it"));
  return absl::OkStatus();
}

}  // namespace plexus::transport
