// ClusterState::CopyShard: the ops that copy one shard of a buffer from one
// worker to another, shared by recovery (recovery.cc) and snapshots
// (snapshots.cc).
#include <utility>

#include "plexus/common/types.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus {

void ClusterState::CopyShard(uint64_t src_id, int32_t src_shard,
                             int64_t src_worker, uint64_t dst_id,
                             int32_t dst_shard, const DeviceRef& dst,
                             const TensorSpec& spec, bool report,
                             WorkerOps* ops) {
  TellPeer(src_worker, dst.worker_id);
  proto::WorkerOp t;
  auto* tr = t.mutable_transfer();
  tr->set_buffer_id(src_id);
  tr->set_shard(src_shard);
  tr->set_dst_worker_id(dst.worker_id);
  tr->set_dst_buffer_id(dst_id);
  tr->set_dst_shard(dst_shard);
  tr->set_dst_device(dst.device);
  (*ops)[src_worker].push_back(std::move(t));
  proto::WorkerOp e;
  auto* ex = e.mutable_expect();
  ex->set_buffer_id(dst_id);
  ex->set_shard(dst_shard);
  ex->set_owned(true);
  ex->set_report(report);
  ex->set_src_worker_id(src_worker);
  ex->set_device(dst.device);
  *ex->mutable_spec() = ToProto(spec);
  (*ops)[dst.worker_id].push_back(std::move(e));
}

}  // namespace plexus
