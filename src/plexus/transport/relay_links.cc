#include "plexus/transport/relay_links.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/internal/fetch_answers.h"
#include "plexus/transport/internal/frame_socket.h"

namespace plexus::transport {

using internal::FrameSocket;
using internal::FrameType;

static_assert(kRelayedValueBytes == FrameSocket::kSmallFrameBytes,
              "a relayed value is one small frame");

struct RelayLinks::Link {
  Link(internal::UniqueFd fd, int original, bool is_unix)
      : socket(std::move(fd), is_unix), original_fd(original) {}
  absl::Mutex mu;
  FrameSocket socket ABSL_GUARDED_BY(mu);
  const int original_fd;  // the connection's own descriptor: Ended's key
  bool shut ABSL_GUARDED_BY(mu) = false;
};

RelayLinks::RelayLinks(DataPlaneCounters* counters, Timeline* timeline)
    : counters_(counters), timeline_(timeline) {}

RelayLinks::~RelayLinks() {
  absl::flat_hash_map<uint64_t, std::shared_ptr<Link>> links;
  {
    absl::MutexLock lock(&mu_);
    links.swap(links_);
  }
  for (auto& [client, link] : links) {
    absl::MutexLock link_lock(&link->mu);
    link->socket.Shutdown();
  }
}

absl::Status RelayLinks::Open(uint64_t client, int fd) {
  const int copy = ::dup(fd);
  if (copy < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "relay link for client ", client, ": dup: ", std::strerror(errno)));
  }
  int domain = AF_UNIX;
  socklen_t size = sizeof(domain);
  getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &size);
  auto link = std::make_shared<Link>(internal::UniqueFd(copy), fd,
                                     /*is_unix=*/domain == AF_UNIX);
  std::shared_ptr<Link> replaced;
  {
    // Listed before the ACK goes (a relayed call may follow the ACK at
    // once), and the ACK sent under the link's lock: before any answer.
    absl::MutexLock link_lock(&link->mu);
    {
      absl::MutexLock lock(&mu_);
      auto& slot = links_[client];
      replaced = std::move(slot);
      slot = link;
    }
    if (absl::Status s = link->socket.SendControl(FrameType::kAck, {});
        !s.ok()) {
      link->shut = true;
      Unlist(client, fd);
      return s;
    }
  }
  if (replaced != nullptr) Shut(*replaced, /*shutdown=*/true);
  SPDLOG_DEBUG("relay: client {} opened a link", client);
  return absl::OkStatus();
}

void RelayLinks::Ended(uint64_t client, int fd) {
  if (std::shared_ptr<Link> ended = Unlist(client, fd)) {
    Shut(*ended, /*shutdown=*/false);  // its connection is ending anyway
  }
}

void RelayLinks::Drop(uint64_t client) {
  if (std::shared_ptr<Link> dropped = Unlist(client, -1)) {
    Shut(*dropped, /*shutdown=*/true);
  }
}

std::shared_ptr<RelayLinks::Link> RelayLinks::Unlist(uint64_t client, int fd) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(client);
  if (it == links_.end() || (fd >= 0 && it->second->original_fd != fd)) {
    return nullptr;
  }
  std::shared_ptr<Link> link = std::move(it->second);
  links_.erase(it);
  return link;
}

void RelayLinks::Shut(Link& link, bool shutdown) {
  absl::MutexLock link_lock(&link.mu);
  link.shut = true;
  if (shutdown) link.socket.Shutdown();
}

bool RelayLinks::Has(uint64_t client) const { return Find(client) != nullptr; }

std::shared_ptr<RelayLinks::Link> RelayLinks::Find(uint64_t client) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(client);
  return it == links_.end() ? nullptr : it->second;
}

void RelayLinks::Answer(
    uint64_t client, const ShardKey& key,
    const absl::StatusOr<std::shared_ptr<const Storage>>& result,
    int64_t since_ns) {
  std::shared_ptr<Link> link = Find(client);
  if (link == nullptr) return;
  FrameType type = FrameType::kSkip;
  absl::string_view payload;
  int32_t code = 0;
  if (!result.ok()) {
    type = FrameType::kError;
    payload = result.status().message();
    if (payload.size() > FrameSocket::kSmallFrameBytes) {
      payload.remove_suffix(payload.size() - FrameSocket::kSmallFrameBytes);
    }
    code = static_cast<int32_t>(result.status().code());
  } else if (*result != nullptr &&
             internal::AnswerableAtOnce(**result, /*with_bytes=*/true)) {
    type = FrameType::kData;
    payload = absl::string_view(static_cast<const char*>((*result)->data()),
                                (*result)->size());
  }
  std::string frame;
  bool whole = false;
  bool is_unix = false;
  {
    absl::MutexLock link_lock(&link->mu);
    if (link->shut) return;
    is_unix = link->socket.is_unix();
    absl::StatusOr<size_t> went =
        link->socket.TrySendSmall(type, key, payload, &frame, code);
    whole = went.ok() && *went == frame.size();
    if (!whole) {
      // Part of a frame or none: the stream cannot go on. The client sees
      // its end and fetches what it was waiting for.
      link->shut = true;
      link->socket.Shutdown();
    }
  }
  if (!whole) {
    counters_->relay_links_shut.fetch_add(1);
    SPDLOG_INFO(
        "relay: client {}'s link could not take the answer of {} at once "
        "(the client left relayed values unread): shut down; the client "
        "fetches instead",
        client, KeyString(key));
    Unlist(client, link->original_fd);
    return;
  }
  counters_->relayed_answers.fetch_add(1);
  if (type == FrameType::kData) {
    counters_->bytes_to_clients.fetch_add(static_cast<int64_t>(payload.size()));
  }
  if (timeline_ != nullptr && timeline_->enabled()) {
    TimelineEvent event;
    event.kind = EventKind::kFetch;
    event.end_ns = timeline_->NowNs();
    event.start_ns = since_ns != 0 ? since_ns : event.end_ns;
    event.client_id = client;
    event.buffer_id = key.buffer_id;
    event.shard = key.shard;
    event.bytes =
        type == FrameType::kData ? static_cast<int64_t>(payload.size()) : 0;
    event.path = is_unix ? TransferPath::kSharedMemory : TransferPath::kTcp;
    event.failed = type == FrameType::kError;
    timeline_->Record(event);
  }
}

}  // namespace plexus::transport
