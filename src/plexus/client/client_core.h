// Internal: the state behind a Client, shared with its slices and futures
// (shared_ptr: futures may outlive the Client object, e.g. in Python; a
// release after Close is then a no-op).
//
// Threads: the sender (drains queued ops into one message per write, and
// sends counters every second) and the reader (slice replies, call errors,
// workers that died).
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "plexus/client/client.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  explicit ClientCore(ClientOptions options) : options_(std::move(options)) {}
  ~ClientCore();
  absl::Status Init(const std::string& address);
  void Close();

  uint64_t client_id() const { return client_id_; }
  uint64_t NextId() { return (client_id_ << 40) | next_id_++; }

  // Queues ops for the sender; waits while too many are queued.
  void Enqueue(std::vector<proto::ClientOp> ops);
  void Flush();
  absl::StatusOr<proto::SliceInfo> RequestSlice(proto::SliceRequest req);

  void ReleaseBuffer(uint64_t buffer_id, uint64_t slice_id);
  void ReleaseSlice(uint64_t slice_id);

  // Errors the server reported for buffers (rejected calls), and workers
  // known to be down.
  void MarkFailed(uint64_t buffer_id, const absl::Status& status);
  absl::Status BufferStatus(uint64_t buffer_id);
  void ForgetBuffer(uint64_t buffer_id);
  absl::Status WorkerStatus(int64_t worker_id);

  // --- recovery (the server's Recovery notes)
  // The id buffer `id` has now (itself unless recovery gave it a new one).
  uint64_t Resolve(uint64_t id) const {
    if (!has_aliases_.load(std::memory_order_acquire)) return id;
    return ResolveSlow(id);
  }
  // Why buffer `id` (as resolved) is lost, or OK.
  absl::Status LostStatus(uint64_t id) const;
  // Whether slice `slice_id` lost a host that no spare replaced.
  bool SliceBroken(uint64_t slice_id) const;
  // How many worker losses the server has told this client of.
  int64_t losses_heard() const;
  // Waits until more than `heard` losses were told, or `timeout` passes
  // (false), or the session ends (false).
  bool AwaitLoss(int64_t heard, absl::Duration timeout);
  void AddSlice(Slice* slice);
  void RemoveSlice(Slice* slice);
  // Keeps the shards of put `id` (on slice `slice_id`) until the server
  // says the buffer is released for good, to put them again should the
  // host holding one be lost (Recovery.reput_ids).
  void KeepPut(uint64_t id, uint64_t slice_id,
               std::vector<std::shared_ptr<Storage>> shards);

  // FailedPrecondition once Close() has begun: a closed client does no
  // more work (puts, calls, fetches), and says so. Unavailable once the
  // server ended the session (it restarted or went away), saying what was
  // lost.
  absl::Status CheckOpen() const;

  // A data-plane connection to the worker holding `device`, in use until
  // it is handed back (Checkin: kept for reuse; Discard: closed). While in
  // use it is woken (shut down) when the server reports its worker down or
  // the client closes, so no fetch waits on a worker that will not answer.
  // `also_on`: other workers whose loss ends the request too (a wait on
  // many workers' shards ends when any of them is lost).
  absl::StatusOr<std::unique_ptr<transport::DataPlaneConnection>> Checkout(
      const proto::SliceDevice& device, absl::Span<const int64_t> also_on = {});
  void Checkin(int64_t worker_id,
               std::unique_ptr<transport::DataPlaneConnection> conn);
  void Discard(std::unique_ptr<transport::DataPlaneConnection> conn);
  bool SameMachine(const proto::SliceDevice& device) const;

  transport::DataPlaneCounters& data_counters() { return data_counters_; }
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> bytes_put{0};
  std::atomic<int64_t> bytes_fetched{0};
  std::atomic<int64_t> live_futures{0};
  std::atomic<int64_t> wait_round_trips{0};
  bool closed() const;
  const ClientOptions& options() const { return options_; }
  // Sequential dispatch: blocks until every input is computed (or failed).
  void AwaitInputs(const std::vector<Future>& inputs);

 private:
  void SenderLoop();
  void ReaderLoop();
  uint64_t ResolveSlow(uint64_t id) const;
  // Puts shards again for a recovery (its own thread: the reader must not
  // wait on a worker).
  void RePutLoop();
  void ApplyRecoveryLocked(const proto::Recovery& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientOptions options_;
  std::string machine_id_;
  uint64_t client_id_ = 0;
  // This session as the workers know it: its client id and the credential
  // the server issued, which every data-plane connection proves (never
  // sends). Set once by Init.
  transport::DataPlaneIdentity identity_{};
  std::atomic<uint64_t> next_id_{1};

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Controller::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::ClientToServer, proto::ServerToClient>>
      stream_;
  std::thread sender_;
  std::thread reader_;
  transport::DataPlaneCounters data_counters_;

  // closed_, readable without the lock (CheckOpen runs on every call).
  std::atomic<bool> closing_{false};
  // Set when the server ended the session without Close (it restarted or
  // went away): every later use fails with SessionLost().
  std::atomic<bool> session_lost_{false};
  absl::Status SessionLost() const;
  std::string address_;  // the server's, as given to Init
  mutable absl::Mutex mu_;
  std::vector<proto::ClientOp> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_broken_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, proto::SliceReply> slice_replies_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, absl::Status> workers_down_ ABSL_GUARDED_BY(mu_);
  // Recovery: buffers under new ids (old -> newest), buffers lost, slices
  // broken, worker losses heard, and the slices to remap.
  std::atomic<bool> has_aliases_{false};
  absl::flat_hash_map<uint64_t, uint64_t> aliases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> lost_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> broken_slices_
      ABSL_GUARDED_BY(mu_);
  int64_t losses_heard_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Slice*> slices_ ABSL_GUARDED_BY(mu_);
  struct KeptPut {
    uint64_t slice_id = 0;
    std::vector<std::shared_ptr<Storage>> shards;
  };
  absl::flat_hash_map<uint64_t, KeptPut> kept_puts_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, int32_t>> reputs_ ABSL_GUARDED_BY(mu_);
  std::thread reputter_;  // started by the reader on the first reput
  std::map<int64_t,
           std::vector<std::unique_ptr<transport::DataPlaneConnection>>>
      pool_ ABSL_GUARDED_BY(mu_);
  // Connections checked out now: the worker each talks to, and the other
  // workers whose loss also wakes it (Checkout's also_on).
  struct InUse {
    int64_t worker = 0;
    std::vector<int64_t> also_on;
    bool NeedsWorker(int64_t w) const {
      return worker == w ||
             std::find(also_on.begin(), also_on.end(), w) != also_on.end();
    }
  };
  absl::flat_hash_map<transport::DataPlaneConnection*, InUse> in_use_
      ABSL_GUARDED_BY(mu_);
};

// One sharded buffer as the client holds it. The last Future copy destroys
// it, which releases the buffer on the workers.
class BufferHandle {
 public:
  BufferHandle(std::shared_ptr<ClientCore> core, uint64_t id, ArgSpec arg,
               std::shared_ptr<Slice> slice)
      : core_(std::move(core)),
        id_(id),
        arg_(std::move(arg)),
        slice_(std::move(slice)) {
    core_->live_futures++;
  }
  ~BufferHandle() {
    core_->live_futures--;
    core_->ForgetBuffer(id_);
    core_->ReleaseBuffer(id_, slice_->id());
  }
  uint64_t id() const { return id_; }
  // The id the value has now: recovery may have recomputed it under
  // another (ClientCore::Resolve).
  uint64_t current_id() const { return core_->Resolve(id_); }
  const ArgSpec& arg() const { return arg_; }
  const std::shared_ptr<Slice>& slice() const { return slice_; }

 private:
  std::shared_ptr<ClientCore> core_;
  uint64_t id_;
  ArgSpec arg_;
  std::shared_ptr<Slice> slice_;
};

}  // namespace plexus
