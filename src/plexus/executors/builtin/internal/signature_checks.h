// The argument checks behind the signatures' InferOutputs error messages
// (catalogue.h). Every check's error starts with "argument <i>: " and shows
// the argument with ArgSpec::ToString, e.g. "argument 0: expected rank 2,
// got float32[8] replicated". Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "plexus/common/types.h"

namespace plexus::builtin::internal {

// "argument <index>: <what>, got <arg>".
absl::Status ArgError(int index, const ArgSpec& arg, absl::string_view what);

// The argument count is `expected`, num_shards is positive, and every
// argument has a local shape over num_shards devices.
absl::Status CheckArgs(const std::vector<ArgSpec>& inputs, size_t expected,
                       int num_shards);

// inputs[index]'s dtype is one of `allowed`.
absl::Status CheckDType(const std::vector<ArgSpec>& inputs, int index,
                        std::initializer_list<DType> allowed);
absl::Status CheckFloat(const std::vector<ArgSpec>& inputs, int index);

absl::Status CheckRank(const std::vector<ArgSpec>& inputs, int index,
                       size_t rank);

// inputs[index] has the same global spec and sharding as inputs[other].
absl::Status CheckSameAs(const std::vector<ArgSpec>& inputs, int index,
                         int other);

// inputs[index] is not partial. The error reads "argument <i> is partial
// (<arg>); <why>".
absl::Status CheckNotPartial(const std::vector<ArgSpec>& inputs, int index,
                             absl::string_view why);

// The local spec of an argument that passed CheckArgs.
TensorSpec LocalOf(const ArgSpec& arg, int num_shards);

}  // namespace plexus::builtin::internal
