// What the worker has to tell the server besides heartbeats, gathered
// until the control-stream writer sends it: calls finished (with each
// client's usage), reported copies that arrived, and transfers a peer
// sender could not deliver. Device threads, peer senders and the reader
// add to it; the writer (ServerSession) takes what is due.
//
// Finished calls go out in batches: once kReportBatch have gathered, or
// kReportDelay after the first of them (the server's admission windows
// cover that delay); a failed transfer goes at once.
//
// Thread-safe. One lock (mu_), held only briefly and never across a call
// out of this class; the heartbeat thread only tries it (TryUsage).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

class ReportQueue {
 public:
  static constexpr int kReportBatch = 512;
  static constexpr absl::Duration kReportDelay = absl::Milliseconds(1);

  explicit ReportQueue(Clock* clock) : clock_(clock) {}  // not owned

  // The last task of a call on this worker ended (done or failed): the
  // server's admission hears of it (CallsDone; not for a call no server
  // admitted: ticket 0), and the client's usage grows.
  void CallFinished(const proto::Execute& exec, bool failed,
                    int64_t busy_micros, int64_t queued_micros);
  // A reported copy (Expect.report) arrived: told in the next CallsDone.
  void CopyArrived(uint64_t buffer_id);
  // A peer sender could not deliver `key` to `dst_worker`: the server
  // fails the key there.
  void TransferFailed(int64_t dst_worker, const transport::ShardKey& key,
                      const absl::Status& reason);
  // The client left: its usage is no longer reported.
  void ClientGone(uint64_t client);
  // Device time and calls per live client (WorkerStats.clients), or
  // nothing when the lock is held at this instant (the heartbeat never
  // waits for it).
  std::optional<std::vector<proto::ClientUsage>> TryUsage();

  // The writer: blocks until something is due, and moves it to `out`;
  // false once Close() was called (what is pending then is not sent).
  bool AwaitReports(std::vector<proto::WorkerToServer>* out);
  // The session is over: AwaitReports returns false from now on.
  void Close();
  // Open again, empty, for the next server session (WorkerImpl::Resume):
  // what was queued for the last server is dropped (its calls' tickets
  // mean nothing to the next one).
  void Reopen();

 private:
  bool PendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a batch's delay if this is its first report.
  void NoteFirstLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  absl::Mutex mu_;
  absl::CondVar wake_writer_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::TransferFailed> failed_transfers_ ABSL_GUARDED_BY(mu_);
  // Calls finished since the writer last took them, and when the first of
  // them finished.
  proto::CallsDone calls_done_ ABSL_GUARDED_BY(mu_);
  absl::Time first_done_ ABSL_GUARDED_BY(mu_);
  struct Usage {
    int64_t busy_micros = 0;
    int64_t calls = 0;
    int64_t tasks = 0;
    int64_t queued_micros = 0;
  };
  absl::flat_hash_map<uint64_t, Usage> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
