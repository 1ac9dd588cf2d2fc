// The sorted worker lists of admission's calls in flight, one copy per
// distinct list: every call over the same hosts (all of a slice's calls)
// shares it.
//
// Why: each worker's report of a call reads where that worker is in the
// call's list. With a list per call, a report of a call over 32 hosts read
// memory no one had touched since the call was admitted — a cache miss
// per host per call, most of a report's cost at 32 hosts (issue 28). A
// shared list is read by every call's reports, so it stays in cache.
//
// A handful of recent lists are kept for reuse (kKept, replaced oldest
// first); a list lives as long as a call in flight holds it, whether it
// is still kept or not. Not thread-safe: admission holds it under its lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace plexus {

class WorkerLists {
 public:
  using List = std::shared_ptr<const std::vector<int64_t>>;
  static constexpr size_t kKept = 8;

  // The shared list equal to `workers` (sorted): a kept one, or a new one
  // kept from now on in place of the oldest.
  List Share(const std::vector<int64_t>& workers) {
    for (const List& kept : kept_) {
      if (kept != nullptr && *kept == workers) return kept;
    }
    List& slot = kept_[next_];
    next_ = (next_ + 1) % kKept;
    slot = std::make_shared<const std::vector<int64_t>>(workers);
    return slot;
  }

 private:
  std::array<List, kKept> kept_;
  size_t next_ = 0;  // the slot replaced next
};

}  // namespace plexus
