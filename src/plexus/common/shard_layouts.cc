// ShardLayouts (see the header).
#include "plexus/common/shard_layouts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus {

void ShardLayouts::Add(const proto::ShardLayout& layout) {
  Layout& kept = layouts_[layout.layout_id()];
  kept.client_id = layout.client_id();
  kept.devices.assign(layout.devices().begin(), layout.devices().end());
  kept.shards.assign(layout.shards().begin(), layout.shards().end());
}

void ShardLayouts::ForgetClient(uint64_t client_id) {
  absl::erase_if(layouts_, [client_id](const auto& entry) {
    return entry.second.client_id == client_id;
  });
}

absl::Status ShardLayouts::Expand(proto::Execute* exec) const {
  if (exec->layout_id() == 0) return absl::OkStatus();
  auto it = layouts_.find(exec->layout_id());
  if (it == layouts_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call ", exec->call_id(), " names shard layout ", exec->layout_id(),
        ", which this host was never told (or whose client is gone): it "
        "cannot tell which of its devices run which shards"));
  }
  const Layout& layout = it->second;
  const size_t n = std::min(layout.devices.size(), layout.shards.size());
  exec->clear_tasks();
  exec->mutable_tasks()->Reserve(static_cast<int>(n));
  for (size_t k = 0; k < n; ++k) {
    proto::ShardTask* task = exec->add_tasks();
    if (k + 1 < n) {
      *task = exec->own_task();
    } else {
      task->Swap(exec->mutable_own_task());  // the last takes the template
    }
    task->set_device(layout.devices[k]);
    task->set_shard(layout.shards[k]);
    for (proto::InputBinding& binding : *task->mutable_inputs()) {
      if (binding.pieces_size() > 0) {
        binding.mutable_pieces(0)->set_shard(layout.shards[k]);
      }
    }
  }
  exec->clear_own_task();
  exec->set_layout_id(0);
  return absl::OkStatus();
}

}  // namespace plexus
