// Internal: one thread that reads every worker's REPORTS frames (its calls
// done) on the ops connections the server opened to the workers' data
// planes (WorkerChannel), with epoll.
//
// A call over H hosts comes back as H reports, each on its own worker's
// connection; a thread per connection took a wake-up (and a context
// switch) per report, so the server's cost per call grew with the hosts
// by that much. Here the reports that arrived together are read on one
// wake-up: epoll says which connections have bytes, each is read without
// blocking (recv with MSG_DONTWAIT: the socket stays blocking for the
// writer of its OPS frames) into a buffer of its own, and every whole frame
// in it is handed to the connection's callback, in order. A partial frame
// waits in the buffer for the rest, so a worker that stops mid-frame holds
// nothing but its own reports. At most kReadPerWake bytes are taken from
// one connection per wake-up (level-triggered: the rest on the next), so
// one busy worker does not starve the others; a read that returns less
// than it asked is the socket's all (no second recv to hear EAGAIN).
//
// A connection's end (EOF, an error, a frame that is not a well-formed
// REPORTS frame: transport/internal/frame_socket.h's rules) is said once
// (OnEnd), and the connection is no longer polled; Remove closes it.
//
// Thread-safe. Callbacks run on the poller's thread, never two at once;
// Remove waits for one under way for that worker and none runs for it
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

namespace plexus {

class ReportsPoller {
 public:
  // One frame's message (a proto::WorkerToServer in wire form; the callee
  // may take its bytes). An error ends the connection (OnEnd says it).
  using OnReport = std::function<absl::Status(std::string& message)>;
  // The connection ended: `why` (the worker closed it, an I/O error, a
  // malformed frame, a report's error).
  using OnEnd = std::function<void(const absl::Status& why)>;

  static constexpr size_t kReadPerWake = 256 << 10;
  // Ready connections taken per epoll_wait.
  static constexpr int kEventsPerWait = 512;

  static absl::StatusOr<std::unique_ptr<ReportsPoller>> Start();
  // Stops the thread; connections not removed are closed, unsaid.
  ~ReportsPoller();

  // Reads worker `id`'s frames from `fd` (owned from here on: a dup of its
  // ops connection's socket) until its end or Remove. An error (a
  // descriptor epoll refuses) closes `fd`; nothing is called.
  absl::Status Add(int64_t id, int fd, OnReport on_report, OnEnd on_end);
  // No callback for `id` runs once this returns; its descriptor is closed.
  void Remove(int64_t id);

 private:
  ReportsPoller() = default;
  struct Connection {
    int fd = -1;
    OnReport on_report;
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

  // Where each recv lands (the loop's alone).
  std::vector<char> scratch_ = std::vector<char>(64 << 10);
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: stops the loop
  std::thread thread_;
  absl::Mutex mu_;
  // By worker id. Entries are erased only by Remove, which waits while
  // `busy`: the loop keeps a Connection's address across its callbacks.
  absl::flat_hash_map<int64_t, std::unique_ptr<Connection>> connections_
      ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace plexus
