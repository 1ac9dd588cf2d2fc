// The worker's session with the server: the control stream it registers
// on, and four threads over it. The reader reads the server's ops and an
// applier thread applies them in order (through the `apply` function the
// worker gives Connect; ops_inbox.h says why two threads); the
// writer sends what the report queue gathers as it comes; the heartbeat
// thread sends a heartbeat (the worker's figures, and a clock probe)
// every heartbeat interval, and at once when the server asks for one
// (SendStats, a fresh status).
//
// Heartbeats are what the server's failure detector reads, so nothing
// else the worker does may hold them up: they have their thread to
// themselves, which waits only on beat_mu_ (no other work takes it) and on
// write_mu_ or report_mu_ (held only around one write); their figures come
// from counters or from locks that are free at that instant (`stats`). A
// compile, a long execution or a busy store does not delay them.
//
//   Connect ──▶ serving ──(the server ends the stream, or Shutdown)──▶ done
//
// The server's ops may move off the stream (ServerToWorker.
// ops_on_data_plane, the stream's last message): every later message then
// comes as an OPS frame on the data-plane connection the server opened,
// which that connection's thread gives to ApplyFramed, and everything the
// worker sends from then on (calls done, heartbeats, timeline chunks,
// transfer failures) goes back on that connection as REPORTS frames
// (WriteReport; protocol version 3), read by the server's reports poller
// with every other worker's: the stream then carries nothing but the
// session's registration and its end.
// ApplyFramed waits
// until the reader has applied the stream's last message (a frame may
// arrive first: the two are different sockets), so `apply` still sees
// every message in the server's order and one at a time. That connection
// ending ends the session, as the stream's end does.
//
// Owns the stream, its threads and the session's end status. Borrows the
// options, the identity (it sets the worker id and generation), the
// timeline and the report queue; they outlive it.
//
// Thread-safe. Locks: mu_, write_mu_, beat_mu_ and probe_mu_, each a leaf
// (none is held while another is taken).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/timeline/timeline.h"
#include "plexus/worker/report_queue.h"
#include "plexus/worker/worker.h"
#include "plexus/worker/worker_identity.h"

namespace plexus {

class ServerSession {
 public:
  ServerSession(const WorkerOptions& options, WorkerIdentity& me,
                Timeline& timeline, ReportQueue& reports);
  ~ServerSession();  // Shutdown(), then joins the threads

  // Registers with `hello` (a WorkerToServer.register, which Connect
  // completes with the credential and protocol version), applies the
  // server's first message with `apply`, and starts the threads: the
  // reader gives every later message to `apply`, the heartbeat thread
  // sends what `stats` says. `bound_address`: the TCP data plane as bound
  // (logged where it differs from the address registered).
  absl::Status Connect(proto::WorkerToServer hello,
                       const std::string& bound_address,
                       std::function<void(proto::ServerToWorker&)> apply,
                       std::function<proto::WorkerStats()> stats);
  // After a session ended (not by Shutdown): registers again with `hello`
  // on a new stream, with the same `apply` and `stats`, and starts the
  // threads again; the report queue is opened again, empty. For a worker
  // that outlives its server (WorkerImpl::Resume).
  absl::Status Reconnect(proto::WorkerToServer hello,
                         const std::string& bound_address);
  // Whether the server took the worker back with its state (the last
  // registration's ServerToWorker.resumed).
  bool resumed() const { return resumed_; }
  // Blocks until the server closes the session or Shutdown() is called.
  absl::Status Wait();
  void Shutdown();
  // Joins the threads (after Shutdown, or once the stream has ended).
  void Join();

  // An OPS frame of registration `generation` (a ServerToWorker in wire
  // form): waits until the stream said the ops moved to frames, then
  // applies it. An error (not this session's generation, the session
  // ended, a malformed message) closes the frames' connection.
  absl::Status ApplyFramed(uint64_t generation, const std::string& bytes);
  // The connection that carried the OPS frames of `generation` ended
  // (`why`): the session, if it is that one, ends too (Unavailable).
  void FramedOpsEnded(uint64_t generation, const absl::Status& why);
  // The connection carrying the OPS frames of `generation` opened: `fd`
  // is its socket (the data plane's; a dup is kept), on which every
  // message to the server goes as a REPORTS frame once the ops moved.
  void FramedConnectionOpened(uint64_t generation, int fd);
  // OPS frames applied, REPORTS frames sent (all sessions): tests and
  // stats read them.
  int64_t framed_messages() const { return framed_messages_.load(); }
  int64_t framed_reports() const { return framed_reports_.load(); }

  // Ops of the session itself (the reader thread applies them).
  // The heartbeats' clock probe: the last round trip completed, read now.
  void ApplyClockEcho(const proto::ClockEcho& echo);
  // The timeline's events since request.since_ns, in chunks.
  void SendTimeline(const proto::CollectTimeline& request);
  // A heartbeat now, its figures read after this call, answering
  // request.request_id (a fresh status waits for it).
  void SendStats(const proto::SendStats& request);

 private:
  // Registers and reads the server's first message into `first`.
  absl::Status Register(proto::WorkerToServer& hello,
                        proto::ServerToWorker* first);
  void ReaderLoop();
  // After `apply` took a message of the stream: if it moved the ops to
  // frames, ApplyFramed may go on (the session's generation).
  void NoteOpsMoved(const proto::ServerToWorker& msg);
  // The session's end: done_, end_status_, the generation that ended.
  void EndLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriterLoop();
  void HeartbeatLoop();
  // Tells the heartbeat thread to stop (the session is over).
  void StopHeartbeats();
  // One message to the server: a REPORTS frame on the ops connection once
  // the ops moved there, else (or if that write failed) on the control
  // stream. The writer, the heartbeat thread and the reader (timeline
  // chunks) share both, one write at a time. False once the stream is
  // closed.
  bool WriteToServer(const proto::WorkerToServer& msg);
  // `msg` as a REPORTS frame on the ops connection, where the ops moved
  // there in this session: false if not (it goes on the stream), or if the
  // frame could not be sent (the connection broke: the stream takes it,
  // and the session ends soon).
  bool WriteReport(const proto::WorkerToServer& msg);

  const WorkerOptions& options_;
  WorkerIdentity& me_;
  Timeline& timeline_;
  ReportQueue& reports_;
  std::function<void(proto::ServerToWorker&)> apply_;
  std::function<proto::WorkerStats()> stats_;
  // The server's, or options_.heartbeat_interval; set before the threads
  // start.
  absl::Duration heartbeat_interval_ = absl::Milliseconds(100);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Controller::Stub> stub_;
  // Made by each registration; TryCancel from any thread under mu_.
  std::unique_ptr<grpc::ClientContext> context_;
  std::atomic<bool> resumed_{false};
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::WorkerToServer, proto::ServerToWorker>>
      stream_;
  std::thread reader_;
  std::thread writer_;
  std::thread heartbeat_;

  // One Write (or the WritesDone) at a time on stream_; after WritesDone
  // nothing more is written. Held only around those calls.
  absl::Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
  // The heartbeat thread's own lock: no other work ever holds it.
  absl::Mutex beat_mu_;
  absl::CondVar beat_wake_;
  bool beat_stop_ ABSL_GUARDED_BY(beat_mu_) = false;
  // The server's last SendStats request, and the last a heartbeat
  // answered: a beat goes at once while they differ.
  uint64_t stats_asked_ ABSL_GUARDED_BY(beat_mu_) = 0;
  uint64_t stats_answered_ ABSL_GUARDED_BY(beat_mu_) = 0;
  // The last clock round trip completed (the server's ClockEcho, read at
  // t4), which the next heartbeat carries.
  absl::Mutex probe_mu_;
  proto::ClockProbe last_probe_ ABSL_GUARDED_BY(probe_mu_);

  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;  // WritesDone was called
  // The generation whose ops come as frames (0: none, or the stream has
  // not said so yet), sessions that ended (their frames are refused), and
  // frames being applied (Join waits for them).
  uint64_t framed_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> ended_generations_ ABSL_GUARDED_BY(mu_);
  int framed_applying_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown was called
  // Why the frames' connection ended the session (the reader says it).
  absl::Status framed_end_ ABSL_GUARDED_BY(mu_);
  // The generation whose ops connection ended (FramedOpsEnded): every
  // frame it carried was applied.
  uint64_t framed_closed_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled by EndLocked and FramedOpsEnded.
  absl::CondVar session_end_;
  // How long the stream's end waits for the ops connection's (ReaderLoop).
  static constexpr absl::Duration kFramedDrain = absl::Seconds(1);
  // How long FramedOpsEnded waits for the stream to end by itself.
  static constexpr absl::Duration kFramedEndGrace = absl::Seconds(2);
  std::atomic<int64_t> framed_messages_{0};
  std::atomic<int64_t> framed_reports_{0};
  // The ops connection's socket (a dup) and its generation: the reports'
  // way back. report_mu_ is held across a send (one report at a time);
  // fd_mu_, a leaf, guards the descriptor: it is closed (when replaced,
  // or after a failed send, or with the session object) only under both,
  // so a send's descriptor stays open, and shut down (as the session
  // ends, waking a blocked send) under fd_mu_ alone.
  absl::Mutex report_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::Mutex fd_mu_ ABSL_ACQUIRED_AFTER(mu_, report_mu_);
  int report_fd_ ABSL_GUARDED_BY(fd_mu_) = -1;
  uint64_t report_generation_ ABSL_GUARDED_BY(report_mu_) = 0;
  std::string report_bytes_ ABSL_GUARDED_BY(report_mu_);  // reused
};

}  // namespace plexus
