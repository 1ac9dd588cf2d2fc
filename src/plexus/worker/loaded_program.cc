#include "plexus/worker/loaded_program.h"

namespace plexus {

std::shared_ptr<const LocalOutputs> LoadedProgram::OutputsOn(int shards) {
  {
    absl::MutexLock lock(&first_use_mu);
    if (local_outputs != nullptr && local_outputs->shards == shards) {
      return local_outputs;
    }
  }
  auto made = std::make_shared<LocalOutputs>();
  made->shards = shards;
  made->spec.resize(outputs.size());
  made->error.resize(outputs.size());
  for (size_t o = 0; o < outputs.size(); ++o) {
    absl::StatusOr<TensorSpec> local = outputs[o].Local(shards);
    if (local.ok()) {
      made->spec[o] = *std::move(local);
    } else {
      made->error[o] = local.status();
    }
  }
  absl::MutexLock lock(&first_use_mu);
  local_outputs = std::move(made);
  return local_outputs;
}

}  // namespace plexus
