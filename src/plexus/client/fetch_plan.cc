#include "plexus/client/fetch_plan.h"

#include <set>

namespace plexus {

absl::StatusOr<FetchPlan> PlanFetch(const ArgSpec& arg, int n) {
  FetchPlan plan;
  if (arg.sharding.is_mesh()) {
    std::set<Shape> seen;  // each block's start
    for (int j = 0; j < n; ++j) {
      absl::StatusOr<Box> box = arg.BlockOf(n, j);
      if (!box.ok()) return box.status();
      if (!seen.insert(box->start).second) continue;
      plan.reads.push_back(j);
      plan.boxes.push_back(*std::move(box));
    }
  } else {
    for (int j = 0; j < (arg.sharding.is_replicated() ? 1 : n); ++j) {
      plan.reads.push_back(j);
    }
  }
  return plan;
}

}  // namespace plexus
