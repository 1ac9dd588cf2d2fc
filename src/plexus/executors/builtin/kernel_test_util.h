// Test helpers for the built-in kernels: host arrays, and running a kernel
// as one shard of a call the way a worker would (infer, allocate, run).
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin::testing {

// A shard's local array in host memory.
struct HostArray {
  TensorSpec spec;
  std::vector<unsigned char> bytes;

  template <typename T>
  static HostArray Of(Shape shape, const std::vector<T>& values) {
    HostArray array{{internal::DTypeOf<T>(), std::move(shape)}, {}};
    array.bytes.resize(values.size() * sizeof(T));
    if (!values.empty()) {
      std::memcpy(array.bytes.data(), values.data(), array.bytes.size());
    }
    return array;
  }

  template <typename T>
  std::vector<T> values() const {
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
};

inline absl::StatusOr<std::vector<ArgSpec>> Infer(
    const std::string& kernel, const std::vector<ArgSpec>& args,
    int num_shards = 1, const Attrs& attrs = {}) {
  const KernelSignature* k = KernelCatalogue::Global().Find(kernel);
  if (k == nullptr) return absl::NotFoundError("no kernel " + kernel);
  return k->InferOutputs(args, num_shards, attrs);
}

// Runs shard `shard` of a call over `num_shards` devices whose arguments
// are `args` (global) with this shard's pieces `locals`.
inline absl::StatusOr<std::vector<HostArray>> RunShard(
    const std::string& kernel, const std::vector<ArgSpec>& args,
    const std::vector<HostArray>& locals, const Attrs& attrs = {},
    int shard = 0, int num_shards = 1, Collectives* collectives = nullptr) {
  const Kernel* k = KernelRegistry::Global().Find(kernel);
  if (k == nullptr) return absl::NotFoundError("no kernel " + kernel);
  auto outputs = k->signature().InferOutputs(args, num_shards, attrs);
  if (!outputs.ok()) return outputs.status();
  KernelContext ctx;
  ctx.attrs = &attrs;
  ctx.shard = shard;
  ctx.num_shards = num_shards;
  ctx.collectives = collectives;
  for (size_t i = 0; i < locals.size(); ++i) {
    ctx.inputs.push_back({locals[i].spec, locals[i].bytes.data()});
    ctx.input_shardings.push_back(args[i].sharding);
  }
  std::vector<HostArray> results;
  for (const ArgSpec& out : *outputs) {
    auto local = out.Local(num_shards);
    if (!local.ok()) return local.status();
    // Poison the buffer so a kernel that forgets an element is caught.
    results.push_back(
        {*local, std::vector<unsigned char>(local->byte_size(), 0xAB)});
  }
  for (HostArray& out : results) {
    ctx.outputs.push_back({out.spec, out.bytes.data()});
  }
  if (auto s = k->Run(ctx); !s.ok()) return s;
  return results;
}

// Runs `kernel` over one device with replicated arguments `locals`.
inline absl::StatusOr<std::vector<HostArray>> RunReplicated(
    const std::string& kernel, const std::vector<HostArray>& locals,
    const Attrs& attrs = {}) {
  std::vector<ArgSpec> args;
  for (const HostArray& local : locals) {
    args.push_back({local.spec, Sharding::Replicated()});
  }
  return RunShard(kernel, args, locals, attrs);
}

// The message of a failed status, or "OK" so that a substring match fails
// with a readable diff.
template <typename S>
std::string MessageOf(const S& status_or) {
  if constexpr (std::is_same_v<S, absl::Status>) {
    return status_or.ok() ? "OK" : std::string(status_or.message());
  } else {
    return status_or.ok() ? "OK" : std::string(status_or.status().message());
  }
}

inline ArgSpec Arg(DType dtype, Shape shape,
                   Sharding sharding = Sharding::Replicated()) {
  return {{dtype, std::move(shape)}, sharding};
}

}  // namespace plexus::builtin::testing
