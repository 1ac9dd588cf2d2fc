// The attribute parsing and shape arithmetic that matmul and reduce_sum's
// signatures (signatures_linalg.cc) and bodies (kernels_linalg.cc) share.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"

namespace plexus::builtin::internal {

// Where the logical axes of a[m, k] and b[k, n] are stored, given the
// transpose flags (a stored [k, m] when transpose_a, b stored [n, k] when
// transpose_b).
struct MatmulAxes {
  int a_m, a_k, b_k, b_n;
  // From attributes transpose_a and transpose_b (0 or 1, default 0).
  static absl::StatusOr<MatmulAxes> FromAttrs(const Attrs& attrs);
};

// The reduced axis from attribute `axis`: -1 (the default) for all axes.
absl::StatusOr<int> ReducedAxis(const Attrs& attrs, size_t rank);

// `shape` without `axis`; a scalar's shape for axis -1.
Shape ReducedShape(const Shape& shape, int axis);

}  // namespace plexus::builtin::internal
