// FramePoller: one thread that reads the frames of many connections with
// epoll: the server's, every worker's REPORTS frames (its calls done) on
// the ops connections it opened to the workers' data planes
// (WorkerChannel); the simulated hosts' process (sim/), the server's OPS
// frames on thousands of connections its data plane handed over
// (DataPlaneHandler::TakeOpsConnection).
//
// A call over H hosts comes back as H reports, each on its own worker's
// connection; a thread per connection took a wake-up (and a context
// switch) per report, so the server's cost per call grew with the hosts
// by that much. Here the frames that arrived together are read on one
// wake-up: epoll says which connections have bytes, each is read without
// blocking (recv with MSG_DONTWAIT: the socket stays blocking for the
// writer of its frames the other way) into a buffer of its own, and every
// whole frame in it is handed to the connection's callback, in order. A
// partial frame waits in the buffer for the rest, so a peer that stops
// mid-frame holds nothing but its own frames. At most kReadPerWake bytes
// are taken from one connection per wake-up (level-triggered: the rest on
// the next), so one busy peer does not starve the others; a read that
// returns less than it asked is the socket's all (no second recv to hear
// EAGAIN).
//
// Each poller takes frames of one type (Start's `type`: REPORTS or OPS);
// a connection's frames must all carry the generation of its first (as a
// connection thread of the data plane requires of OPS frames).
//
// A connection's end (EOF, an error, a frame that is not a well-formed
// frame of the poller's type: transport/internal/frame_socket.h's rules,
// or of another generation) is said once (OnEnd), and the connection is
// no longer polled; Remove closes it.
//
// Thread-safe. Callbacks run on the poller's thread, never two at once;
// Remove waits for one under way for that connection and none runs for it
// after. mu_ is a leaf, never held across a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace plexus::transport {

// The frames a poller takes.
enum class PolledFrames { kReports, kOps };

class FramePoller {
 public:
  // One frame's message (a REPORTS frame's proto::WorkerToServer, an OPS
  // frame's proto::ServerToWorker, in wire form; the callee may take its
  // bytes). An error ends the connection (OnEnd says it).
  using OnFrame = std::function<absl::Status(std::string& message)>;
  // The connection ended: `why` (the peer closed it, an I/O error, a
  // malformed frame, a callback's error).
  using OnEnd = std::function<void(const absl::Status& why)>;

  static constexpr size_t kReadPerWake = 256 << 10;
  // Ready connections taken per epoll_wait.
  static constexpr int kEventsPerWait = 512;

  // `thread_name`: the poller thread's (at most 15 characters); `peer`:
  // who is at the other end, in the end's message ("the worker": "the
  // worker closed it"). Both are kept as given: string literals.
  static absl::StatusOr<std::unique_ptr<FramePoller>> Start(
      PolledFrames type, const char* thread_name, const char* peer);
  // Stops the thread; connections not removed are closed, unsaid.
  ~FramePoller();

  // Reads connection `id`'s frames from `fd` (owned from here on: a dup of
  // the connection's socket) until its end or Remove; `generation`, if not
  // 0, is the one every frame must carry (else the first frame's). An
  // error (an id polled already, a descriptor epoll refuses) closes `fd`;
  // nothing is called.
  absl::Status Add(int64_t id, int fd, OnFrame on_frame, OnEnd on_end,
                   uint64_t generation = 0);
  // No callback for `id` runs once this returns; its descriptor is closed.
  void Remove(int64_t id);

 private:
  FramePoller(PolledFrames type, const char* thread_name, const char* peer)
      : type_(type), thread_name_(thread_name), peer_(peer) {}
  struct Connection {
    int fd = -1;
    uint64_t generation = 0;  // its frames' (0: not known yet)
    OnFrame on_frame;
    OnEnd on_end;
    std::string in;        // bytes read, not yet handed out as frames
    bool ended = false;    // OnEnd was said; not polled any more
    bool busy = false;     // the poller is reading it or in its callbacks
    bool removed = false;  // Remove began: no callback from now on
  };
  void Loop();
  // Reads what `c` has (at most kReadPerWake) and hands out its whole
  // frames: OK, or why the connection ended.
  absl::Status ReadAndDeliver(Connection& c);

  const PolledFrames type_;
  const char* const thread_name_;
  const char* const peer_;
  // Where each recv lands (the loop's alone).
  std::vector<char> scratch_ = std::vector<char>(64 << 10);
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: stops the loop
  std::thread thread_;
  absl::Mutex mu_;
  // By id. Entries are erased only by Remove, which waits while
  // `busy`: the loop keeps a Connection's address across its callbacks.
  absl::flat_hash_map<int64_t, std::unique_ptr<Connection>> connections_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace plexus::transport
