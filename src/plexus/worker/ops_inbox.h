// The server's messages read from the worker's control stream, waiting to
// be applied (ServerSession): the stream's reader pushes each as it
// arrives, one applier thread pops them in order. An op that waits (a
// lock, the store) then holds up the applier only: the reader stays in
// gRPC, where it keeps the connection answered (with a server list the
// worker's channel pings every second and gives a connection up when a
// ping goes a second unanswered: common/tls.cc) and the server's writes
// flowing.
//
// Bounded: a push waits while max_bytes of messages wait (the server's
// writes then wait on the stream's flow control, as when the reader
// applied each itself).
//
// Thread-safe. One lock, a leaf.
#pragma once

#include <cstddef>
#include <deque>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

class OpsInbox {
 public:
  static constexpr size_t kMaxBytes = size_t{64} << 20;
  explicit OpsInbox(size_t max_bytes = kMaxBytes) : max_bytes_(max_bytes) {}

  // Waits while the inbox holds `max_bytes` or more (one message of any
  // size is always taken); after Close, drops `msg`.
  void Push(proto::ServerToWorker msg);
  // The oldest message, waiting for one; false once closed and empty.
  bool Pop(proto::ServerToWorker* msg);
  // No more pushes: Pop returns what is left, then false.
  void Close();

 private:
  const size_t max_bytes_;
  absl::Mutex mu_;
  // Each with its size.
  std::deque<std::pair<proto::ServerToWorker, size_t>> messages_
      ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace plexus
