#include "plexus/transport/internal/fetch_answers.h"

#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace plexus::transport::internal {

struct FetchAnswers::Shared {
  enum class State { kOpen, kSending, kSent, kClaimed };
  absl::Mutex mu;
  State state ABSL_GUARDED_BY(mu) = State::kOpen;
  absl::Status sent ABSL_GUARDED_BY(mu);    // the hook's send, once kSent
  std::string rest ABSL_GUARDED_BY(mu);     // the frame's bytes not yet sent
  size_t payload ABSL_GUARDED_BY(mu) = 0;   // DATA bytes the frame carries
  int64_t sent_ns ABSL_GUARDED_BY(mu) = 0;  // when, on `timeline`'s clock
  Timeline* timeline ABSL_GUARDED_BY(mu) = nullptr;  // a parked one's
  // The connection's eventfd while the answer is parked: written when the
  // connection's thread is wanted. -1 once it is not (the descriptor may
  // be closed and its number reused).
  int wake ABSL_GUARDED_BY(mu) = -1;

  void Poke() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (wake >= 0) eventfd_write(wake, 1);
  }
  // Claims the answer for the connection's thread, or waits out the hook's
  // send: what it sent, where it answered. No hook sends afterwards.
  std::optional<Sent> Claim() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    wake = -1;
    if (state == State::kOpen) {
      state = State::kClaimed;  // the hook stands down
      return std::nullopt;
    }
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return state == State::kSent;
    };
    mu.Await(absl::Condition(&done));
    return Sent{sent, std::move(rest), payload, sent_ns};
  }
};

struct FetchAnswers::Parked {
  FrameHeader header;
  std::shared_ptr<Shared> shared;
  DataPlaneHandler::ReadyWatch watch;
  Timeline* timeline = nullptr;  // where its event is recorded, if anywhere
  TimelineEvent event;
};

namespace {

// The hook: runs on the thread that readies the shard (see the header for
// what it answers). `socket` is touched only while the state is kSending,
// which the connection's thread waits out.
DataPlaneHandler::ReadyHook HookFor(std::shared_ptr<FetchAnswers::Shared> s,
                                    const FrameHeader& header,
                                    FrameSocket* socket) {
  const bool wait = header.frame_type() == FrameType::kWait;
  return [s = std::move(s), wait, key = header.key(),
          socket](absl::StatusOr<std::shared_ptr<const Storage>> result) {
    using State = FetchAnswers::Shared::State;
    if (!result.ok() || *result == nullptr ||
        !AnswerableAtOnce(**result, /*with_bytes=*/!wait)) {
      s->Poke();  // a parked answer's thread words it
      return;
    }
    Timeline* timeline;
    {
      absl::MutexLock lock(&s->mu);
      if (s->state != State::kOpen) return;
      s->state = State::kSending;
      timeline = s->timeline;
    }
    const Storage& data = **result;
    std::string frame;
    absl::StatusOr<size_t> went = socket->TrySendSmall(
        wait ? FrameType::kAck : FrameType::kData, key,
        wait ? absl::string_view()
             : absl::string_view(static_cast<const char*>(data.data()),
                                 data.size()),
        &frame);
    absl::MutexLock lock(&s->mu);
    s->payload = wait ? 0 : data.size();
    if (went.ok()) s->rest = frame.substr(*went);
    s->sent = went.status();
    if (timeline != nullptr) s->sent_ns = timeline->NowNs();
    s->state = State::kSent;
    // A parked answer's thread sends the rest, or closes on the error.
    if ((!went.ok() || !s->rest.empty()) && s->wake >= 0) {
      eventfd_write(s->wake, 1);
    }
  };
}

}  // namespace

bool AnswerableAtOnce(const Storage& data, bool with_bytes) {
  if (const DeviceBuffer* device = data.device_buffer()) {
    const std::optional<absl::Status> computed = device->Computed();
    if (!computed.has_value() || !computed->ok()) return false;
  }
  return !with_bytes || (data.size() <= FrameSocket::kSmallFrameBytes &&
                         data.data() != nullptr);
}

FetchAnswers::FetchAnswers(FrameSocket& socket, DataPlaneHandler& handler,
                           DataPlaneCounters& counters, Clock& clock)
    : socket_(socket), handler_(handler), counters_(counters), clock_(clock) {}

FetchAnswers::~FetchAnswers() {
  if (parked_ != nullptr) Finish(*parked_, /*deliver=*/false).IgnoreError();
}

absl::Status FetchAnswers::Serve(const FrameHeader& header,
                                 ScopedEvent& event) {
  if (!wake_.valid()) {
    // Made at the first request (a connection that fetches nothing has
    // none); without one, answers are awaited as before parking existed.
    const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd >= 0) wake_ = UniqueFd(fd);
  }
  auto shared = std::make_shared<Shared>();
  const ShardKey key = header.key();
  DataPlaneHandler::ReadyWatch watch;
  std::optional<absl::StatusOr<std::shared_ptr<const Storage>>> now;
  if (wake_.valid()) {
    {
      absl::MutexLock lock(&shared->mu);
      shared->wake = wake_.get();
      shared->timeline = event.timeline();
    }
    now = handler_.WatchReady(
        key, HookFor(shared, header, &socket_), [shared] { shared->Poke(); },
        &watch);
  } else {
    now = handler_.AwaitReadyTelling(key, HookFor(shared, header, &socket_));
  }
  if (!now.has_value()) {
    parked_ = std::make_unique<Parked>(
        Parked{header, std::move(shared), watch, event.Dismiss(), event.event});
    return absl::OkStatus();
  }
  // Known at once (or awaited by a handler that cannot watch, whose hook
  // may have answered meanwhile).
  if (std::optional<Sent> sent = shared->Claim()) {
    return FinishSent(*sent, /*deliver=*/true);
  }
  return SendResult(header, *std::move(now));
}

absl::Status FetchAnswers::FinishParked() {
  if (parked_ == nullptr) return absl::OkStatus();
  bool deliver = true;
  if (!socket_.has_read_ahead()) {
    pollfd fds[2] = {{socket_.fd(), POLLIN | POLLRDHUP, 0},
                     {wake_.get(), POLLIN, 0}};
    const absl::Time deadline = parked_->watch.deadline;
    while (true) {
      int timeout_ms = -1;
      if (deadline != absl::InfiniteFuture()) {
        timeout_ms = static_cast<int>(std::max<int64_t>(
            0, absl::ToInt64Milliseconds(deadline - clock_.Now()) + 1));
      }
      const int n = poll(fds, 2, timeout_ms);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        deliver = false;  // cannot wait: the connection closes
        break;
      }
      // The next frame, the socket's end, the hook or the bound.
      if (fds[0].revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) {
        deliver = false;
      }
      break;
    }
  }
  std::unique_ptr<Parked> parked = std::move(parked_);
  return Finish(*parked, deliver);
}

absl::Status FetchAnswers::Finish(Parked& parked, bool deliver) {
  const ShardKey key = parked.header.key();
  absl::Status result;
  std::optional<Sent> sent = parked.shared->Claim();
  // No poke comes from this answer now: one that came is spent.
  eventfd_t drained;
  eventfd_read(wake_.get(), &drained);  // nonblocking: none is fine
  if (sent.has_value()) {
    handler_.EndWatch(key, parked.watch);
    result = FinishSent(*sent, deliver);
    parked.event.end_ns = sent->at_ns;
  } else if (!deliver) {
    handler_.EndWatch(key, parked.watch);
    parked.event.failed = true;
  } else {
    result =
        SendResult(parked.header, handler_.AwaitWatched(key, parked.watch));
  }
  if (parked.timeline != nullptr) {
    if (parked.event.end_ns == 0)
      parked.event.end_ns = parked.timeline->NowNs();
    parked.timeline->Record(parked.event);
  }
  return result;
}

absl::Status FetchAnswers::FinishSent(const Sent& sent, bool deliver) {
  if (!sent.status.ok()) return sent.status;
  if (deliver) {
    if (absl::Status s = socket_.SendRemainder(sent.rest); !s.ok()) return s;
  }
  counters_.early_answers.fetch_add(1);
  counters_.bytes_to_clients.fetch_add(static_cast<int64_t>(sent.payload));
  return absl::OkStatus();
}

absl::Status FetchAnswers::SendResult(
    const FrameHeader& header,
    absl::StatusOr<std::shared_ptr<const Storage>> ready) {
  const ShardKey key = header.key();
  if (ready.ok() && *ready == nullptr) {
    ready = absl::InternalError(
        absl::StrCat(KeyString(key), " is ready but holds no storage"));
  }
  if (!ready.ok()) {
    return socket_.SendError(FrameType::kError, key, ready.status());
  }
  if (header.frame_type() == FrameType::kWait) {
    return socket_.SendControl(FrameType::kAck, key);
  }
  // The client reads host memory (shared with it where large): a value in
  // device memory is copied out now, once per fetch.
  ready = Storage::InHostMemory(*std::move(ready), /*shareable=*/true);
  if (!ready.ok()) {
    return socket_.SendError(FrameType::kError, key, ready.status());
  }
  const Storage& data = **ready;
  if (absl::Status s = socket_.SendShard(FrameType::kData, key, data);
      !s.ok()) {
    return s;
  }
  counters_.bytes_to_clients.fetch_add(static_cast<int64_t>(data.size()));
  return absl::OkStatus();
}

}  // namespace plexus::transport::internal
