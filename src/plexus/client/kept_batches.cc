#include "plexus/client/kept_batches.h"

#include <iterator>
#include <utility>

namespace plexus {

void KeptBatches::Keep(proto::ClientToServer&& batch, uint64_t seq) {
  ops_ += batch.ops_size();
  // Almost always at the end: one batch is written at a time.
  auto at = batches_.end();
  while (at != batches_.begin() && std::prev(at)->seq > seq) --at;
  batches_.insert(at, Kept{seq, std::move(batch)});
  while (ops_ > max_ops_ && batches_.size() > 1) {
    ops_ -= batches_.front().batch.ops_size();
    batches_.pop_front();
  }
}

void KeptBatches::ForEach(
    const std::function<void(const proto::ClientToServer&)>& f) const {
  for (const Kept& k : batches_) f(k.batch);
}

void KeptBatches::Clear() {
  batches_.clear();
  ops_ = 0;
}

}  // namespace plexus
