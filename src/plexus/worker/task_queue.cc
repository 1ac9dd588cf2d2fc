#include "plexus/worker/task_queue.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"

namespace plexus {

TaskQueue::Task TaskQueue::Pop() {
  // The first task runs unless a later one is reorderable, the first of its
  // client, before any task that is not reorderable, and has a lower start
  // tag. Nothing passes a task that is not reorderable: a collective's peers
  // on other devices may already wait for it.
  size_t best = 0;
  if (queue_.front().order.reorderable) {
    absl::InlinedVector<uint64_t, 8> seen = {queue_.front().order.client};
    const size_t n =
        std::min(queue_.size(), static_cast<size_t>(kMaxLookahead));
    for (size_t i = 1; i < n; ++i) {
      const TaskOrder& o = queue_[i].order;
      if (!o.reorderable) break;
      if (std::find(seen.begin(), seen.end(), o.client) != seen.end()) {
        continue;  // not its client's first
      }
      seen.push_back(o.client);
      if (o.start_tag < queue_[best].order.start_tag) best = i;
    }
  }
  Task task = std::move(queue_[best].task);
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(best));
  return task;
}

}  // namespace plexus
