// The ids of the last values released on a worker (ObjectStore), so that a
// read of one ends at once instead of waiting for a declaration that will
// not come; a declaration takes an id back out. At most `capacity` are
// kept, the oldest forgotten first.
//
// A declaration looks its id up on every call's output: in a set of tens
// of thousands of ids that is a cache miss per value. A client numbers its
// values in order, so the values declared are mostly newer than every id
// remembered: Forget skips the set for an id above the largest ever added
// (since the last Clear), which no remembered id can equal.
//
// Not thread-safe: the store's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/container/flat_hash_set.h"

namespace plexus {

class RememberedIds {
 public:
  explicit RememberedIds(size_t capacity) : capacity_(capacity) {}

  // Remembers `id` (already remembered: nothing changes), forgetting the
  // oldest past the capacity.
  void Add(uint64_t id) {
    if (!ids_.insert(id).second) return;
    if (id > max_) max_ = id;
    order_.push_back(id);
    if (order_.size() > capacity_) {
      ids_.erase(order_.front());
      order_.pop_front();
    }
  }
  // Forgets `id` (its order entry ages out).
  void Forget(uint64_t id) {
    if (id <= max_ && !ids_.empty()) ids_.erase(id);
  }
  bool Contains(uint64_t id) const { return ids_.contains(id); }
  void Clear() {
    ids_.clear();
    order_.clear();
    max_ = 0;
  }
  size_t size() const { return ids_.size(); }

 private:
  const size_t capacity_;
  absl::flat_hash_set<uint64_t> ids_;
  std::deque<uint64_t> order_;
  uint64_t max_ = 0;  // the largest id added since the last Clear
};

}  // namespace plexus
