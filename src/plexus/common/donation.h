// Donation (jax.jit's donate_argnums) as a program declares it: the inputs
// each call consumes, each paired with the output its program writes over
// the input's memory where the runtime can hand it over
// (proto::XlaProgram.donated_inputs / donated_outputs). The one rule for
// such a declaration; the client applies it when it compiles, the server
// when a program is registered.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

// The donated inputs of `def`, whose parsed inputs and outputs are given:
// pairs as many as inputs, each input and output named once and in range,
// each pair of one layout (global spec and sharding). InvalidArgument
// naming the program and what is wrong.
absl::StatusOr<std::vector<int>> DonatedInputs(
    const proto::ProgramDef& def, const std::vector<ArgSpec>& inputs,
    const std::vector<ArgSpec>& outputs);

}  // namespace plexus
