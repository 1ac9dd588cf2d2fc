// Built-in C++ kernels as the worker runs them: the program backend for
// host logic, tests and benchmarks. Each kernel is its signature, from the
// catalogue (catalogue.h: names, shape rules, attributes, documentation),
// and its body here (KernelBody::Run: the computation on one shard's
// buffers, OpenBLAS for matmul). Only the worker and the kernels' tests
// link the bodies; the server, the client and the Python binding link the
// catalogue alone.
//
// Thread-safety: bodies are stateless and thread-safe; the global registry
// is built once, on first use (thread-safe), and immutable after. No locks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plexus/common/clock.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/catalogue.h"

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
  // The clock a body that waits reads and sleeps on (busy_wait,
  // device_sleep): the worker's injected one.
  Clock* clock = Clock::Real();
};

// What a kernel computes: one shard's outputs from its inputs.
class KernelBody {
 public:
  virtual ~KernelBody() = default;
  // Runs one shard. Errors become the message of the call's futures.
  virtual absl::Status Run(const KernelContext& ctx) const = 0;
};

// A catalogued kernel with its body: what a worker loads for a program.
class Kernel {
 public:
  Kernel(const KernelSignature* signature, std::unique_ptr<KernelBody> body)
      : signature_(signature), body_(std::move(body)) {}
  const KernelSignature& signature() const { return *signature_; }
  absl::Status Run(const KernelContext& ctx) const { return body_->Run(ctx); }

 private:
  const KernelSignature* signature_;  // owned by the catalogue
  std::unique_ptr<KernelBody> body_;
};

// Kernel bodies by name, as the kernel files register them.
using KernelBodies =
    std::vector<std::pair<std::string, std::unique_ptr<KernelBody>>>;

class KernelRegistry {
 public:
  // The built-in kernels: KernelCatalogue::Global() with the bodies of
  // kernels_*.cc, built on first use. Fails where the two do not name the
  // same kernels: the worker checks this at start-up.
  static absl::StatusOr<const KernelRegistry*> Builtin();
  // Builtin(), which must have succeeded (aborts otherwise).
  static const KernelRegistry& Global();

  // Pairs every signature of `catalogue` (which must outlive the registry)
  // with the body of the same name. An error names the first kernel that
  // has a signature and no body, a body and no signature, or two bodies.
  static absl::StatusOr<std::unique_ptr<KernelRegistry>> Create(
      const KernelCatalogue& catalogue, KernelBodies bodies);

  // Null if unknown.
  const Kernel* Find(const std::string& name) const;
  std::vector<std::string> Names() const;  // sorted

 private:
  KernelRegistry() = default;
  std::vector<std::pair<std::string, Kernel>> kernels_;  // sorted by name
};

}  // namespace plexus::builtin
