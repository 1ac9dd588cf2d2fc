// A data-plane connection's answers to its client's FETCH and WAIT
// requests (DataPlaneServer's connection thread owns one per connection).
//
// An answer is sent by whichever comes first: the thread that readies the
// shard (the handler's hook) or the connection's own thread. The hook
// answers only what needs no waiting there and little time: an ACK, or a
// small value in host memory, or in device memory once computed and read
// in place (an XLA output of the CPU plugin, which runs a small program
// inline, before its outputs are published). A large value, one still
// computing or on a GPU, and an error (which the connection's thread
// words) are left to the connection's thread. Only one of them sends; the
// hook never blocks on a peer that stops reading (the connection's thread
// sends what it could not), and a connection's frames keep their order.
//
// Where the handler watches a shard without a thread blocked on it
// (DataPlaneHandler::WatchReady), the connection's thread does not wait
// either: the answer is parked, and the thread goes back to its socket.
// It is woken (an eventfd) only when the hook cannot answer or left bytes
// unsent, or when the wait would look again; else by the next frame, the
// socket's end, or an unknown key's bound. It then finishes the parked
// answer before anything else (FinishParked), so answers leave in the
// order they were asked for. A round trip whose value the hook answers
// costs the connection's thread one wake-up (its request), not two.
//
// Not thread-safe: the connection's thread calls it. Borrows the socket,
// the handler, the counters and the clock (an unknown key's bound is on
// it); they outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/common/clock.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/socket_io.h"

namespace plexus::transport::internal {

// Whether the thread that readied `data` may answer with it at once: a
// device value only once computed; with `with_bytes` (DATA, not a WAIT's
// ACK), only a small one readable in place (kSmallFrameBytes at most).
bool AnswerableAtOnce(const Storage& data, bool with_bytes);

class FetchAnswers {
 public:
  FetchAnswers(FrameSocket& socket, DataPlaneHandler& handler,
               DataPlaneCounters& counters, Clock& clock);
  // Ends a parked answer unsent (the connection is closing).
  ~FetchAnswers();
  FetchAnswers(const FetchAnswers&) = delete;
  FetchAnswers& operator=(const FetchAnswers&) = delete;

  // Answers the FETCH or WAIT of `header` (authorized), or parks it.
  // `event` is the request's timeline event: a parked answer takes it and
  // records it when the answer is sent. An error: the connection must
  // close.
  absl::Status Serve(const FrameHeader& header, ScopedEvent& event);
  // Whether an answer is parked; FinishParked then comes before the next
  // frame is read.
  bool parked() const { return parked_ != nullptr; }
  // Waits until the parked answer needs this thread, the next frame
  // begins, the socket ends or the unknown key's bound passes; then
  // finishes it (on a socket that ended, unsent).
  absl::Status FinishParked();

  // The state the hook and the connection's thread share (one per
  // request).
  struct Shared;

 private:
  struct Parked;
  // What the hook sent, taken by the connection's thread (which sends the
  // rest without holding the shared lock: a hook that runs again must not
  // wait on a peer that stops reading).
  struct Sent {
    absl::Status status;
    std::string rest;
    size_t payload = 0;
    int64_t at_ns = 0;
  };
  // The answer's end: by the hook's send, or `ready` sent from here
  // (`deliver` false: not sent, the peer has gone).
  absl::Status Finish(Parked& parked, bool deliver);
  // The hook's answer, finished: the bytes it could not send (unless the
  // peer has gone: `deliver` false), and the counters.
  absl::Status FinishSent(const Sent& sent, bool deliver);
  // `ready` as the answer to `header`: an ERROR, an ACK or the DATA.
  absl::Status SendResult(const FrameHeader& header,
                          absl::StatusOr<std::shared_ptr<const Storage>> ready);

  FrameSocket& socket_;
  DataPlaneHandler& handler_;
  DataPlaneCounters& counters_;
  Clock& clock_;
  UniqueFd wake_;  // the eventfd a parked answer's hook writes, once made
  std::unique_ptr<Parked> parked_;
};

}  // namespace plexus::transport::internal
