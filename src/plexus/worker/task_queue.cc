#include "plexus/worker/task_queue.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"

namespace plexus {

TaskQueue::Task TaskQueue::Pop() {
  // The first task runs unless a later one may pass, is the first of its
  // client, has only passable tasks ahead of it, and has a lower start tag.
  size_t best = 0;
  if (queue_.front().order.passable) {
    absl::InlinedVector<uint64_t, 8> seen = {queue_.front().order.client};
    const size_t n =
        std::min(queue_.size(), static_cast<size_t>(kMaxLookahead));
    for (size_t i = 1; i < n; ++i) {
      const TaskOrder& o = queue_[i].order;
      if (std::find(seen.begin(), seen.end(), o.client) == seen.end()) {
        seen.push_back(o.client);  // its client's first
        if (o.may_pass && o.start_tag < queue_[best].order.start_tag) {
          best = i;
        }
      }
      if (!o.passable) break;  // nothing behind it passes it
    }
  }
  Task task = std::move(queue_[best].task);
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(best));
  return task;
}

}  // namespace plexus
