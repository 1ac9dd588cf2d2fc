// The kernel catalogue: what every built-in kernel is, without its body.
// A KernelSignature holds a kernel's names, shape rules (InferOutputs) and
// the queries the compiler asks (collective, mesh shardings, dtypes,
// aliasing); its KernelDoc says the same for users. The server, the client
// and the Python binding compile programs against this catalogue alone:
// it has no kernel bodies and links no BLAS. The bodies (kernel.h) are
// registered by name against it in the library only the worker links, and
// the worker checks at start-up that the two name the same kernels
// (KernelRegistry::Builtin).
//
// A kernel has shard_map semantics: it runs once per shard on that shard's
// local data, and its output shardings say how the local results form the
// logical outputs (a reduction over a split axis gives a `partial` output
// that all_reduce turns into a replicated one).
//
// Thread-safety: signatures are stateless and thread-safe; the global
// catalogue is built once, on first use (thread-safe), and immutable after.
// No locks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"

namespace plexus::builtin {

class KernelSignature {
 public:
  virtual ~KernelSignature() = default;
  // Output global specs and shardings from the inputs' global specs and
  // shardings over `num_shards` devices. Errors name the argument by index
  // and show the shapes and shardings involved, e.g.
  //   "argument 1: expected float32[8, 4] split(0) like argument 0, got
  //    float32[4, 4] split(0)".
  // The caller prefixes the program name.
  virtual absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>& inputs, int num_shards,
      const Attrs& attrs) const = 0;
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
  // Whether only the server may make programs of it (park, unpark): a
  // client's registration is refused.
  virtual bool server_only() const { return false; }
  // Output `output` equals input AliasedInput(output) bit for bit, or -1.
  // Buffers are immutable, so the runtime may hand out the input's buffer
  // as the output; when every output is aliased it skips Run altogether.
  virtual int AliasedInput(int output) const { return -1; }
};

// What a built-in program does and takes, written for its users next to
// its signature's registration: the one source of `plexus.builtins`
// (Python) and of docs/PROGRAMS.md (scripts/programs_md.py). Every kernel
// has one.
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

class KernelCatalogue {
 public:
  // The built-in kernels' signatures (signatures_*.cc), built on first use.
  static const KernelCatalogue& Global();

  // Takes ownership. Registering a name twice, or without a summary, is a
  // programming error (aborts).
  void Register(const std::string& name,
                std::unique_ptr<KernelSignature> signature, KernelDoc doc);
  // Null if unknown.
  const KernelSignature* Find(const std::string& name) const;
  const KernelDoc* FindDoc(const std::string& name) const;
  std::vector<std::string> Names() const;  // sorted

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<KernelSignature> signature;
    KernelDoc doc;
  };
  std::vector<Entry> entries_;
};

}  // namespace plexus::builtin
