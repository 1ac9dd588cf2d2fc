// HostViews: device runtimes' views of one block of host memory, kept with
// the block (Storage::views) so that a value many runs read is wrapped for
// its device once, not once per run.
//
// A view is what a runtime makes to read the block's bytes in place: the
// CPU PJRT plugin's zero-copy buffer over them (xla::PjrtRuntime's
// arguments: a weight put once and read by every call). It is keyed by its
// maker (an address the view keeps alive, so no other maker can have it
// while the view lives), the device it is on and the layout it reads the
// bytes as. A view holds no copy: it reads the block, so it must go before
// the block's bytes do: the block's owner drops its views (Clear) before
// its memory is freed or reused. A view is never written through (a
// runtime reads such an argument only; never donated). At most kMaxViews
// are kept per block: a block read on more devices than that makes the
// others per run, as before. Thread-safe; header-only (the XLA executor
// reads it through XlaArgument without linking the store).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "plexus/common/types.h"

namespace plexus {

class HostViews {
 public:
  static constexpr size_t kMaxViews = 4;

  struct Key {
    const void* maker = nullptr;   // the runtime's (kept alive by the view)
    const void* device = nullptr;  // the maker's device
    TensorSpec spec;               // the layout the bytes are read as
    bool operator==(const Key& o) const {
      return maker == o.maker && device == o.device && spec == o.spec;
    }
  };

  HostViews() = default;
  HostViews(const HostViews&) = delete;
  HostViews& operator=(const HostViews&) = delete;

  // The view kept for `key`, or null.
  std::shared_ptr<const void> Find(const Key& key) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [k, view] : views_) {
      if (k == key) return view;
    }
    return nullptr;
  }

  // Keeps `view` for `key` where none is kept for it and there is room.
  // Returns the view kept for `key` (this one, or one another thread kept
  // first), else `view` itself, kept by no one but its caller.
  std::shared_ptr<const void> Keep(Key key, std::shared_ptr<const void> view) {
    absl::MutexLock lock(&mu_);
    for (const auto& [k, kept] : views_) {
      if (k == key) return kept;
    }
    if (views_.size() < kMaxViews) views_.emplace_back(std::move(key), view);
    return view;
  }

  // Drops every view (each goes when its last reader lets go of it).
  void Clear() {
    decltype(views_) dropped;
    {
      absl::MutexLock lock(&mu_);
      dropped.swap(views_);
    }
    // (Destroyed here, outside the lock: a view's end may wait for its
    // runtime.)
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return views_.size();
  }

 private:
  mutable absl::Mutex mu_;
  absl::InlinedVector<std::pair<Key, std::shared_ptr<const void>>, 1> views_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
