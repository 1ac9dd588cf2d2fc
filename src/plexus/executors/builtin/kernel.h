// Built-in C++ kernels: the program backend for host logic, tests and
// benchmarks. A kernel has shard_map semantics: it runs once per shard on
// that shard's local data, and its output shardings say how the local
// results form the logical outputs (a reduction over a split axis gives a
// `partial` output that all_reduce turns into a replicated one).
//
// Kernels are stateless and thread-safe; the registry is immutable after
// static initialisation.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/common/types.h"

namespace plexus::builtin {

struct ConstTensor {
  TensorSpec spec;  // local (per-shard) spec
  const void* data = nullptr;
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

struct MutableTensor {
  TensorSpec spec;  // local (per-shard) spec
  void* data = nullptr;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// What the worker offers a collective kernel. Every shard of the call calls
// AllReduceSum exactly once; it blocks until all shards of the call (on
// every worker) have contributed, then writes the elementwise sum into
// `out`. The summation order is fixed (shard order on a worker, then rank
// order or ring order between workers), so results are deterministic.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual absl::Status AllReduceSum(const ConstTensor& in,
                                    const MutableTensor& out) = 0;
};

struct KernelContext {
  const Attrs* attrs = nullptr;
  std::vector<ConstTensor> inputs;
  std::vector<MutableTensor> outputs;  // allocated by the caller, uninitialised
  int shard = 0;                       // this shard's index in the slice
  int num_shards = 1;
  Collectives* collectives = nullptr;  // set only for collective kernels
  // The inputs' shardings, as given to InferOutputs, one per input. Kernels
  // whose local result depends on the global shape read them (softmax_xent
  // divides by the global batch); they fail if this is left empty while
  // num_shards > 1.
  std::vector<Sharding> input_shardings;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Output global specs and shardings from the inputs' global specs and
  // shardings over `num_shards` devices. Errors name the argument by index
  // and show the shapes and shardings involved, e.g.
  //   "argument 1: expected float32[8, 4] split(0) like argument 0, got
  //    float32[4, 4] split(0)".
  // The caller prefixes the program name.
  virtual absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const = 0;
  // Runs one shard. Errors become the message of the call's futures.
  virtual absl::Status Run(const KernelContext& ctx) const = 0;
  virtual bool is_collective() const { return false; }
  // Whether the kernel takes inputs laid out by a PartitionSpec over a mesh
  // of several axes (Sharding::kMesh). Elementwise kernels do: each device
  // computes on its block whatever the block is. The others are refused
  // such inputs when a program is compiled.
  virtual bool TakesMeshShardings() const { return false; }
  // Whether the kernel takes inputs of `dtype` (checked at compile time for
  // every input, before InferOutputs). Kernels compute in the arithmetic
  // dtypes; those that only move bytes take every dtype.
  virtual bool AcceptsDType(DType dtype) const {
    return IsArithmeticDType(dtype);
  }
  // Output `output` equals input AliasedInput(output) bit for bit, or -1.
  // Buffers are immutable, so the runtime may hand out the input's buffer
  // as the output; when every output is aliased it skips Run altogether.
  virtual int AliasedInput(int output) const { return -1; }
};

// What a built-in program does and takes, written for its users next to
// its registration: the one source of `plexus.builtins` (Python) and of
// docs/PROGRAMS.md (scripts/programs_md.py). Every kernel has one.
struct KernelDoc {
  struct Attr {
    std::string name;
    std::string kind;      // "float", "int", "string" or "ints"
    std::string fallback;  // the default, as Python writes it; "" required
    std::string meaning;
  };
  std::string summary;  // one sentence
  std::vector<Attr> attrs;
  std::string inputs;   // what each argument may be: dtypes, ranks, shardings
  std::string outputs;  // what the outputs are, and their shardings
  // Python that runs it, given `s` (a slice of 2 devices over 2 hosts),
  // `np` and `plexus`, and checks its result with assert (tests run it).
  std::string example;
};

class KernelRegistry {
 public:
  static KernelRegistry& Global();
  // Takes ownership. Registering a name twice, or without a summary, is a
  // programming error.
  void Register(const std::string& name, std::unique_ptr<Kernel> kernel,
                KernelDoc doc);
  // Null if unknown.
  const Kernel* Find(const std::string& name) const;
  const KernelDoc* FindDoc(const std::string& name) const;
  std::vector<std::string> Names() const;  // sorted

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<Kernel> kernel;
    KernelDoc doc;
  };
  std::vector<Entry> kernels_;
};

// Attribute access with defaults and clear errors ("attribute 'lr' must be a
// number, got a string").
absl::StatusOr<double> GetFloatAttr(const Attrs& attrs, const std::string& key,
                                    std::optional<double> fallback = {});
absl::StatusOr<int64_t> GetIntAttr(const Attrs& attrs, const std::string& key,
                                   std::optional<int64_t> fallback = {});
absl::StatusOr<std::string> GetStringAttr(
    const Attrs& attrs, const std::string& key,
    std::optional<std::string> fallback = {});
absl::StatusOr<std::vector<int64_t>> GetIntsAttr(const Attrs& attrs,
                                                 const std::string& key);

}  // namespace plexus::builtin
