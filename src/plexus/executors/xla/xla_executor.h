// XlaExecutor: the worker's XLA backend. It owns the PJRT runtime (loaded
// on first use, so a worker without a plugin still serves built-in
// kernels) and a content-addressed cache of compiled executables: a
// StableHLO module is compiled once per device assignment, however many
// programs or clients carry it. The cache does not keep executables alive:
// the programs using one do, and when the last goes (its clients left) the
// executable is freed; the module is compiled again if it comes back.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>

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

  // For status: the platform ("cpu"), "" before the first load, or the
  // load error.
  std::string Describe();

  int64_t compiles() const { return compiles_.load(); }
  int64_t cache_hits() const { return cache_hits_.load(); }
  int64_t compile_micros() const { return compile_micros_.load(); }

 private:
  struct Entry {
    std::string module;
    std::string options;
    absl::Mutex mu;  // held while compiling
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status error ABSL_GUARDED_BY(mu);  // a failed compile, kept
    std::weak_ptr<const PjrtExecutable> executable ABSL_GUARDED_BY(mu);
  };
  // Drops entries whose executable is gone (cache_mu_ held).
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);

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
  // Keyed by a hash of module and options; entries with equal hashes are
  // told apart by their contents.
  absl::flat_hash_map<size_t, std::vector<std::shared_ptr<Entry>>> cache_
      ABSL_GUARDED_BY(cache_mu_);
  std::atomic<int64_t> compiles_{0};
  std::atomic<int64_t> cache_hits_{0};
  std::atomic<int64_t> compile_micros_{0};
};

}  // namespace plexus::xla
