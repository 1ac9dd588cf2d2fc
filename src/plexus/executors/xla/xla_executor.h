// XlaExecutor: the worker's XLA backend. It owns the PJRT runtime (loaded
// on first use, so a worker without a plugin still serves built-in
// kernels) and a content-addressed cache of executables: a StableHLO
// module is compiled once per device assignment, however many programs or
// clients carry it, or loaded from the serialized executable of another
// worker (a spare taking the job's executables from a live worker) instead
// of compiled. The cache does not keep executables alive: the programs
// using one do, and when the last goes (its clients left) the executable
// is freed; the module is compiled again if it comes back.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "plexus/executors/xla/pjrt_runtime.h"

namespace plexus::xla {

class XlaExecutor {
 public:
  explicit XlaExecutor(PjrtOptions options) : options_(std::move(options)) {}

  // The runtime, loaded on the first call; a load error is returned by
  // every later call too (the worker keeps serving everything else).
  absl::StatusOr<const PjrtRuntime*> Runtime();

  // The executable of `module` under `compile_options`, compiled on first
  // use. Concurrent requests for one executable compile it once.
  absl::StatusOr<std::shared_ptr<const PjrtExecutable>> GetOrCompile(
      const std::string& module, const std::string& compile_options);

  // The content key of (module, compile options): a fingerprint that is
  // the same in every process (workers ask each other for executables by
  // it). Equal fingerprints are told apart by the contents they carry.
  static uint64_t Fingerprint(const std::string& module,
                              const std::string& compile_options);

  // The cached, live executable of (module, options), or null; a hit is
  // counted. Never compiles.
  std::shared_ptr<const PjrtExecutable> Lookup(
      const std::string& module, const std::string& compile_options);

  // A serialized executable as workers hand it to each other: the
  // plugin's bytes and the content they are the executable of.
  struct Serialized {
    std::string module;
    std::string compile_options;
    std::string executable;  // PjrtRuntime::Serialize
  };
  // Loads the executable of (module, options) from `serialized`, which
  // must be that content's (an error otherwise, nothing cached), without
  // compiling. It must run on `devices` (runtime device indices, one per
  // partition): one whose device assignment differs is refused, so that
  // the caller compiles instead. A live cached executable is returned as
  // it is (a hit); concurrent requests load or compile once.
  absl::StatusOr<std::shared_ptr<const PjrtExecutable>> GetOrLoad(
      const Serialized& serialized, const std::vector<int>& devices);

  // The serialized executable of content `fingerprint`, for a peer:
  // NotFound if none is cached (or it is gone), Unavailable while it is
  // being compiled or loaded, FailedPrecondition naming the compile error
  // once its compile failed here (the failure is cached: this worker will
  // never have it, so a peer waiting for it stops), as it does once this
  // worker's PJRT plugin failed to load (nothing compiles here). One loaded
  // from bytes
  // is served those bytes: the CPU plugin re-serializes a deserialized
  // executable without its kernels' object code.
  absl::StatusOr<Serialized> Serialize(uint64_t fingerprint);

  // For status: the platform ("cpu"), "" before the first load, or the
  // load error.
  std::string Describe();

  int64_t compiles() const { return compiles_.load(); }
  int64_t cache_hits() const { return cache_hits_.load(); }
  int64_t compile_micros() const { return compile_micros_.load(); }
  // Executables loaded from serialized bytes (GetOrLoad), not compiled.
  int64_t serialized_loads() const { return serialized_loads_.load(); }

 private:
  struct Entry {
    std::string module;
    std::string options;
    absl::Mutex mu;  // held while compiling or loading
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status error ABSL_GUARDED_BY(mu);  // a failed compile, kept
    std::weak_ptr<const PjrtExecutable> executable ABSL_GUARDED_BY(mu);
    // The bytes it was loaded from (GetOrLoad), served again as they are.
    std::string serialized ABSL_GUARDED_BY(mu);
  };
  // Drops entries whose executable is gone (cache_mu_ held).
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  // The entry of (module, options), made if `create` and missing.
  std::shared_ptr<Entry> FindEntry(const std::string& module,
                                   const std::string& compile_options,
                                   bool create);

  const PjrtOptions options_;
  absl::Mutex load_mu_;
  bool loaded_ ABSL_GUARDED_BY(load_mu_) = false;
  absl::StatusOr<std::unique_ptr<PjrtRuntime>> runtime_
      ABSL_GUARDED_BY(load_mu_);

  // What Describe() returns, set once the load is done: heartbeats never
  // wait for a plugin that is loading.
  absl::Mutex describe_mu_ ABSL_ACQUIRED_AFTER(load_mu_);  // Runtime() nests
  std::string description_ ABSL_GUARDED_BY(describe_mu_);

  absl::Mutex cache_mu_;
  // Keyed by Fingerprint(module, options); entries with equal
  // fingerprints are told apart by their contents.
  absl::flat_hash_map<uint64_t, std::vector<std::shared_ptr<Entry>>> cache_
      ABSL_GUARDED_BY(cache_mu_);
  std::atomic<int64_t> compiles_{0};
  std::atomic<int64_t> cache_hits_{0};
  std::atomic<int64_t> compile_micros_{0};
  std::atomic<int64_t> serialized_loads_{0};
};

}  // namespace plexus::xla
