// PjrtRuntime: one PJRT C API plugin (a .so loaded at run time, e.g. the
// xla-cpu-pjrt or jax-cuda13-pjrt wheels) and the PJRT client it creates.
// It compiles StableHLO modules into executables and runs them on the
// client's devices, moving buffers between host memory (the object store)
// and the plugin's devices.
//
// Thread-safe: PJRT clients and loaded executables are thread-safe; the
// runtime itself is immutable after Load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/kernel.h"

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_LoadedExecutable;

namespace plexus::xla {

class PjrtRuntime;

// A compiled program, loaded on a fixed list of devices (its device
// assignment, one device per SPMD partition).
class PjrtExecutable {
 public:
  ~PjrtExecutable();
  PjrtExecutable(const PjrtExecutable&) = delete;
  PjrtExecutable& operator=(const PjrtExecutable&) = delete;

  int num_partitions() const { return static_cast<int>(devices_.size()); }
  // The runtime that compiled it, which runs it (PjrtRuntime::Execute).
  const PjrtRuntime& runtime() const { return *runtime_; }
  // The per-partition output specs, as XLA compiled them.
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  // Scratch memory one execution needs on each device, beyond its
  // arguments and outputs (XLA's compiled memory stats; 0 if the plugin
  // does not say).
  int64_t temp_bytes() const { return temp_bytes_; }

 private:
  friend class PjrtRuntime;
  PjrtExecutable(const PjrtRuntime* runtime, PJRT_LoadedExecutable* exe)
      : runtime_(runtime), exe_(exe) {}
  const PjrtRuntime* runtime_;
  PJRT_LoadedExecutable* exe_;
  std::vector<PJRT_Device*> devices_;  // the executable's, partition order
  std::vector<TensorSpec> outputs_;
  int64_t temp_bytes_ = 0;
};

struct PjrtOptions {
  std::string plugin_path;
  // CPU plugins: how many devices the client creates (one per Plexus device
  // of the worker). Ignored by plugins that count their own devices.
  int cpu_device_count = 1;
};

class PjrtRuntime {
 public:
  // dlopens the plugin, checks its API version, initialises it and creates
  // a client. Errors name the plugin path and what failed.
  static absl::StatusOr<std::unique_ptr<PjrtRuntime>> Load(
      const PjrtOptions& options);
  ~PjrtRuntime();

  const std::string& platform() const { return platform_; }  // "cpu", "cuda"
  int num_devices() const { return static_cast<int>(devices_.size()); }
  // "<major>.<minor>" of the plugin's PJRT C API.
  std::string api_version() const;

  // Compiles `module` (StableHLO: MLIR bytecode, text or a portable
  // artifact) with a serialized xla.CompileOptionsProto (its device
  // assignment names this client's device ids).
  absl::StatusOr<std::unique_ptr<PjrtExecutable>> Compile(
      absl::string_view module, absl::string_view compile_options) const;

  // Runs `exe` once over all its partitions and blocks until every output
  // is in host memory. inputs[p][i] is argument i of partition p, read in
  // place where the plugin can (CPU: zero-copy); outputs[p][o] receives
  // output o of partition p; a null `data` discards that output.
  // Whether an input on device `device` (client device index) would be read
  // in place, without a copy: true on CPU for aligned store buffers.
  absl::StatusOr<bool> ReadsInPlace(const builtin::ConstTensor& input,
                                    int device) const;

  absl::Status Execute(
      const PjrtExecutable& exe,
      const std::vector<std::vector<builtin::ConstTensor>>& inputs,
      const std::vector<std::vector<builtin::MutableTensor>>& outputs) const;

 private:
  friend class PjrtExecutable;
  PjrtRuntime() = default;
  absl::Status Init(const PjrtOptions& options);

  std::string plugin_path_;
  void* handle_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::string platform_;
  std::vector<PJRT_Device*> devices_;  // addressable, by id
};

}  // namespace plexus::xla
