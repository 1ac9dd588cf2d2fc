// A worker's relay links: the connections on which it sends its clients
// the values of their calls that the server asked it to relay.
//
// A blocking round trip (a call, then a fetch of its small result) sends a
// client's FETCH to the worker beside its call to the server: two waking
// writes from the client, and a wake-up of the worker's connection thread
// that parks the fetch, on top of the three messages any path through the
// controller needs (client -> server -> worker -> client). A relayed call
// (Call.relay, which the server copies into the worker's Execute and into
// any FailBuffers it sends for the call's outputs) needs no FETCH: the
// thread that decides each of its output shards here sends the answer
// itself, on the connection the client opened for it (a RELAY frame,
// DataPlaneHandler::OpenRelay), and the client reads it there.
//
// One link per client (its latest RELAY). Each answer is one frame, sent
// without blocking: a small value in host memory (at most
// FrameSocket::kSmallFrameBytes, a device value only once computed and
// readable in place) as DATA, a failure as ERROR (code and message), and
// anything else as SKIP (the client fetches it). A link whose socket cannot
// take a whole frame at once (a client that left many relayed values
// unread) is shut down, not waited on: the client sees it end and fetches
// as before. So a relay never blocks the thread that sends it, and costs
// the worker at most a socket buffer per client.
//
// Thread-safe: answers come from any thread (the ops connection's, a
// device's); frames on one link never interleave.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/store/storage.h"
#include "plexus/transport/data_plane.h"

namespace plexus {
class Timeline;  // timeline/timeline.h
}  // namespace plexus

namespace plexus::transport {

class RelayLinks {
 public:
  // `counters` (relayed_answers, relay_links_shut) and `timeline` (a FETCH
  // event per relayed answer, client to worker as a fetch's is; may be
  // null) outlive the links.
  RelayLinks(DataPlaneCounters* counters, Timeline* timeline);
  ~RelayLinks();
  RelayLinks(const RelayLinks&) = delete;
  RelayLinks& operator=(const RelayLinks&) = delete;

  // Takes a dup of `fd` (a data-plane connection's socket, proven to be
  // client `client`'s) as the client's link, replacing one it had (shut
  // down), and sends the RELAY's ACK on it before any answer can.
  absl::Status Open(uint64_t client, int fd);
  // The connection of `fd` ended: the client's link goes, if it is still
  // that one.
  void Ended(uint64_t client, int fd);
  // The client left: its link is shut down and dropped.
  void Drop(uint64_t client);
  // Whether `client` has a link now.
  bool Has(uint64_t client) const;

  // Sends `key`'s answer on `client`'s link (none: nothing is sent):
  // `result` as DATA, ERROR or SKIP (above). A failure may name shard -1:
  // every shard of the buffer here. `since_ns`, on the timeline's clock:
  // when the relay was asked (its event's start).
  void Answer(uint64_t client, const ShardKey& key,
              const absl::StatusOr<std::shared_ptr<const Storage>>& result,
              int64_t since_ns = 0);

 private:
  struct Link;
  std::shared_ptr<Link> Find(uint64_t client) const;
  // Takes `client`'s link out of the list, if it is the one of
  // connection `fd` (-1: whichever it is).
  std::shared_ptr<Link> Unlist(uint64_t client, int fd);
  // Marks it shut (no answer goes on it); `shutdown`: its socket too, so
  // its client sees the end.
  static void Shut(Link& link, bool shutdown);

  DataPlaneCounters* const counters_;
  Timeline* const timeline_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Link>> links_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus::transport
