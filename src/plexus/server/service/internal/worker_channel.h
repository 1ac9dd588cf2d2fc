// Internal: how the server's messages reach one worker. Each write of the
// worker's queue (OutQueue, written by the pool's threads) is one
// proto::ServerToWorker in wire form (scheduling/worker_wire.h): the first
// carries the registration's hello, every one the worker id, then the ops,
// whose bytes were encoded once for all the hosts that get them.
//
// It goes on the worker's gRPC stream until MoveToDataPlane: then the
// stream carries one last message (ServerToWorker.ops_on_data_plane) and
// every later write is one OPS frame on the data-plane connection the
// server opened to the worker (transport/data_plane.h), which the worker's
// connection thread applies as it reads it: no gRPC thread hand-off on
// either side, one send and one read per write. The worker's calls done
// come back on that connection (REPORTS frames, read by the server's
// FramePoller on DupReportsFd's descriptor). The worker applies
// the stream's last message before the first frame, so the order is the
// server's.
//
//   stream ──MoveToDataPlane──▶ frames ──(a write fails, or Shutdown)──▶ closed
//
// A frame that cannot be written (the worker died, or its connection
// broke) cancels the worker's gRPC session, so the server ends it as it
// ends a broken stream (ServeWorker sees its reads end). Shutdown (the
// session's end) wakes a write blocked on a full socket (a stopped worker).
//
// Borrows the stream and the session's context: the session's handler
// owns both and calls Shutdown, then stops the queue, before it returns.
// Thread-safe: writes come from one pool thread at a time (the queue's),
// MoveToDataPlane from the session's handler, Shutdown from any thread.
// Locks: write_mu_ (held across a write, which may block) before
// conn_mu_ (a leaf, never held across I/O).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/scheduling/gang_scheduler.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

class WorkerChannel {
 public:
  using Stream =
      grpc::ServerReaderWriter<grpc::ByteBuffer, proto::WorkerToServer>;

  // `hello`: the first message's own fields (ServerToWorker in wire form);
  // `head`: every message's (the worker id).
  WorkerChannel(Stream* stream, grpc::ServerContext* ctx, std::string hello,
                std::string head, int64_t worker_id);

  // One write of the worker's queue (OutQueue's WriteFn): false once the
  // worker cannot be written to.
  bool Write(std::vector<OutOp>& ops);
  // Sends the stream's last message (with the hello, if nothing was
  // written yet) and writes on `ops` from then on. False, and `ops` is
  // dropped, if the stream could not take that message or the channel was
  // shut down.
  bool MoveToDataPlane(std::unique_ptr<transport::DataPlaneConnection> ops);
  // Wakes a write blocked on the frames' socket and refuses later ones;
  // the reports' reader sees the connection end.
  void Shutdown();
  bool shut_down() {
    absl::MutexLock lock(&conn_mu_);
    return shut_down_;
  }
  // Once on frames: a dup of the frames' connection's socket, where the
  // worker's reports (REPORTS: its calls done) come (the server's
  // FramePoller reads them; Shutdown ends that reading too). -1 before,
  // or once shut down.
  int DupReportsFd();
  // Whether a small write now cannot block: on frames, with no write under
  // way and room in the socket (WriterPool::InlineScope); never on the
  // stream (gRPC cannot say).
  bool WritableNow();

  // Whether writes go as frames.
  bool on_data_plane() const { return on_data_plane_.load(); }

 private:
  bool WriteStream(std::vector<OutOp>& ops, const std::string& extra)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  bool WriteFrame(std::vector<OutOp>& ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  Stream* const stream_;
  grpc::ServerContext* const ctx_;
  const std::string head_;
  const int64_t worker_id_;

  absl::Mutex write_mu_;
  std::string hello_ ABSL_GUARDED_BY(write_mu_);  // cleared once written
  // The frames' connection, once moved; written under write_mu_ only.
  transport::DataPlaneConnection* ops_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  // The frame a write builds, reused per write; its bytes are left
  // uninitialized (each write fills what it sends: no zero-filling).
  std::unique_ptr<char[]> frame_ ABSL_GUARDED_BY(write_mu_);
  size_t frame_capacity_ ABSL_GUARDED_BY(write_mu_) = 0;

  absl::Mutex conn_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  // Owns what ops_ points to: Shutdown reaches it here without write_mu_.
  std::shared_ptr<transport::DataPlaneConnection> conn_
      ABSL_GUARDED_BY(conn_mu_);
  bool shut_down_ ABSL_GUARDED_BY(conn_mu_) = false;

  std::atomic<bool> on_data_plane_{false};
};

}  // namespace plexus
