// Applies the server's op stream to this worker, in order: programs loaded
// and unloaded (the program table), calls executed (TaskRunner::Submit),
// shards declared, expected, released, failed and transferred (the object
// store, the peer table), peers told of and declared down, clients gone,
// and the session's own ops (clock echoes, timeline collection), which go
// to the server session.
//
// Owns the program table. Borrows the rest; they outlive it.
//
// Thread-safety: Apply on the reader thread only (one caller at a time);
// programs_loaded() from any thread. No lock of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "plexus/common/shard_layouts.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/store/object_store.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/relay_links.h"
#include "plexus/worker/loaded_program.h"
#include "plexus/worker/nccl_collective.h"
#include "plexus/worker/peer_table.h"
#include "plexus/worker/report_queue.h"
#include "plexus/worker/server_session.h"
#include "plexus/worker/task_runner.h"
#include "plexus/worker/xla_programs.h"

namespace plexus {

class OpApplier {
 public:
  // `relays`: where a relayed call's outputs are answered (Execute.relay,
  // FailBuffers.relay).
  OpApplier(ObjectStore& store, PeerTable& peers, TaskRunner& tasks,
            XlaPrograms& xla, ReportQueue& reports, ServerSession& session,
            Timeline& timeline, CollectiveGpus* nccl, int num_devices,
            transport::RelayLinks& relays);

  // Applies `op`, consuming it (moved from).
  void Apply(proto::WorkerOp& op);
  // The worker registered as a fresh host after its server went away
  // (WorkerImpl::Resume): every program goes (the next server's clients
  // may be given the last one's ids).
  void UnloadAll();
  // The programs loaded now (WorkerStats.programs_loaded).
  int64_t programs_loaded() const { return programs_loaded_.load(); }

 private:
  void ApplyLoad(proto::LoadProgram& load);
  void ApplyExecute(proto::Execute& exec);
  void ApplyExpect(const proto::Expect& expect);
  void ApplyDeclare(const proto::Declare& declare);
  void ApplyTransfer(const proto::Transfer& transfer);
  void ApplyPeerDown(const proto::PeerDown& down);
  void ApplyClientGone(uint64_t client);
  // FailBuffers: each buffer fails here; a relayed call's failure also
  // goes to its client's relay link.
  void ApplyFail(const proto::FailBuffers& fail);
  // A relayed Execute's output shards here, `keys` (taken before it was
  // submitted), answered on the client's link as each is decided.
  void RelayOutputs(uint64_t client, const std::vector<BufferKey>& keys);
  // The spec of a shard the server declares on `device`, or why this
  // worker cannot hold it (no such device, a spec that does not parse):
  // the shard then fails instead of waiting for data in a wrong size.
  absl::StatusOr<TensorSpec> HeldSpec(const BufferKey& key,
                                      const proto::TensorSpec& spec,
                                      int device) const;

  ObjectStore& store_;
  PeerTable& peers_;
  TaskRunner& tasks_;
  XlaPrograms& xla_;
  ReportQueue& reports_;
  ServerSession& session_;
  Timeline& timeline_;
  CollectiveGpus* const nccl_;  // may be null
  const int num_devices_;
  transport::RelayLinks& relays_;

  // Calls and compile jobs hold their own references.
  absl::flat_hash_map<uint64_t, std::shared_ptr<LoadedProgram>> programs_;
  // Where this worker's devices are in the slices' maps: an own-shards
  // call's Execute becomes its tasks here (common/shard_layouts.h).
  ShardLayouts layouts_;
  std::atomic<int64_t> programs_loaded_{0};  // programs_.size(), for stats
};

}  // namespace plexus
