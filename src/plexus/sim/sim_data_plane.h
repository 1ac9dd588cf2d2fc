// The simulated hosts' data plane: the one DataPlaneServer of a
// plexus-sim-workers process, shared by all its hosts (each registers its
// address). It answers WAIT only: a shard is "ready" once the simulated
// device reported the call that makes it done (or the Expect that brings
// it arrived). It never carries bytes: PUT, FETCH, PUSH and executables are
// refused, saying that a simulated host holds no data.
//
// Readiness is kept per key (buffer id, shard) for the whole process (the
// keys of one slice's hosts never collide: a shard index names one device).
// A key is forgotten when its host releases its buffer.
//
//   unknown ──MarkReady──▶ ready ──Forget──▶ unknown
//      └─────MarkFailed──▶ failed ─Forget──▶ unknown
//
// A WAIT for an unknown key blocks until the key is marked (its call has
// not reached or finished on its host yet), or until Shutdown().
//
// With an OpsSink it also takes the server's ops, as a real worker's data
// plane does: the server opens one connection per simulated host, proving
// the server's credential, and sends that host's ops as OPS frames stamped
// with its registration generation; the sink applies them and is told
// when the connection opens (its socket, for the host's REPORTS back) and
// ends, and may take the connection over after its first frame (the
// process's one epoll thread reads every host's ops: sim_cluster.h).
//
// Thread-safe: one lock (mu_), never held across a call out; each blocked
// WAIT sleeps on a notification of its own, so marking a key wakes only
// its waiters (no condition evaluated per waiter per mark).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "plexus/common/credentials.h"
#include "plexus/transport/data_plane.h"

namespace plexus::sim {

class SimDataPlane final : public transport::DataPlaneHandler {
 public:
  // The server's ops for the host registered under `generation`. Unset
  // (apply empty): the hosts take them on their gRPC streams, and the
  // server's connection is refused.
  struct OpsSink {
    // The host's connection opened; `fd` stays open until `ended` returns
    // (keep a dup to write on it).
    std::function<absl::Status(uint64_t generation, int fd)> opened;
    // One OPS frame: a proto::ServerToWorker in wire form.
    std::function<absl::Status(uint64_t generation, std::string& bytes)> apply;
    std::function<void(uint64_t generation, const absl::Status& why)> ended;
    // After the first frame: the sink reads the connection from now on
    // (true: it kept a dup of `fd`; `ended` is then its reader's to say).
    // Unset: the connection's thread reads every frame.
    std::function<bool(uint64_t generation, int fd)> take;
  };

  explicit SimDataPlane(const ClusterSecret& secret, OpsSink ops = {});
  ~SimDataPlane() override;

  // The keys are ready (each WAIT on them answers ACK).
  void MarkReady(const std::vector<ShardKey>& keys);
  // Every known or future shard of `buffer` fails with `why` until
  // forgotten (FailBuffers).
  void MarkFailed(uint64_t buffer, const absl::Status& why);
  // The host released these keys: WAITs on them block again.
  void Forget(const std::vector<ShardKey>& keys);
  // Wakes every blocked WAIT (it answers Cancelled); later ones too.
  void Shutdown();

  // Keys and failed buffers held now (the records' memory).
  int64_t keys_held() const;

  // --- transport::DataPlaneHandler
  absl::StatusOr<Credential> CredentialFor(
      const transport::DataPlanePeer& peer) override;
  absl::Status Authorize(transport::DataPlaneRequest request,
                         const ShardKey& key,
                         const transport::DataPlanePeer& peer) override;
  absl::Status AdmitIncoming(const ShardKey& key, size_t bytes,
                             bool from_client) override;
  absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(
      const ShardKey& key, size_t bytes, bool from_client) override;
  absl::Status Deliver(const ShardKey& key, std::shared_ptr<Storage> data,
                       bool from_client) override;
  void DeliverError(const ShardKey& key, const absl::Status& error) override {}
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const ShardKey& key) override;
  absl::Status ApplyOps(const transport::DataPlanePeer& peer,
                        uint64_t generation, std::string& message) override;
  absl::Status OpsConnectionOpened(const transport::DataPlanePeer& peer,
                                   uint64_t generation, int fd) override;
  void OpsEnded(const transport::DataPlanePeer& peer, uint64_t generation,
                const absl::Status& why) override;
  bool TakeOpsConnection(const transport::DataPlanePeer& peer,
                         uint64_t generation, int fd) override;

 private:
  // The answer for `key` if it is known (OK: ready), else null.
  const absl::Status* AnswerLocked(const ShardKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterSecret secret_;
  const OpsSink ops_;
  // What a ready key's WAIT hands the server (which only checks it is set).
  const std::shared_ptr<const Storage> token_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<ShardKey, absl::Status> keys_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  // Blocked WAITs by key, each woken once.
  absl::flat_hash_map<ShardKey,
                      std::vector<std::shared_ptr<absl::Notification>>>
      waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus::sim
