// PjrtRuntime: one PJRT C API plugin (a .so loaded at run time, e.g. the
// xla-cpu-pjrt or jax-cuda13-pjrt wheels) and the PJRT client it creates.
// It compiles StableHLO modules into executables and runs them on the
// client's devices. Execute queues a run and returns at once: its outputs
// stay in device memory (PjrtBuffer, the object store's DeviceBuffer) and
// are ready when the run has completed; a run queued on inputs that are not
// ready yet waits for them inside the plugin, not on a host thread. Inputs
// are read where they are: a buffer of this client on the partition's
// device as it is, one on another device by the plugin's device-to-device
// copy, host memory in place where the plugin can (CPU) or copied to the
// device.
//
// pjrt_runtime.cc: the plugin, client, devices and executables;
// pjrt_run.cc: runs and their buffers; internal/pjrt_support.h: what both
// share to speak the C API.
//
// Thread-safe: PJRT clients, buffers and loaded executables are
// thread-safe; the runtime is immutable after Load, but for its completion
// thread (a SerialExecutor), where every run's end is handled.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "plexus/common/clock.h"
#include "plexus/common/serial_executor.h"
#include "plexus/common/types.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/store/device_buffer.h"
#include "plexus/store/host_views.h"

struct PJRT_Api;
struct PJRT_Buffer;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Error;
struct PJRT_Event;
struct PJRT_LoadedExecutable;

namespace plexus::xla {

class PjrtRuntime;
struct PjrtClientHandle;  // the PJRT client, destroyed after its last buffer
class PjrtScope;          // PJRT objects of one operation (internal/)

// An XLA output left in device memory: a PJRT buffer, handed out when its
// run is queued; ready (or failed, with the run's error) once the run has
// completed (DeviceBuffer's states). Keeps the PJRT client alive, so it may
// outlive its runtime.
class PjrtBuffer final : public DeviceBuffer {
 public:
  ~PjrtBuffer() override;
  PjrtBuffer(const PjrtBuffer&) = delete;
  PjrtBuffer& operator=(const PjrtBuffer&) = delete;

  size_t size() const override { return size_; }
  absl::Status Await() const override;
  // Its ready event's state (PJRT_Event_IsReady), then Await's result.
  std::optional<absl::Status> Computed() const override;
  const void* host_address() const override {
    return host_address_.load(std::memory_order_acquire);
  }
  absl::Status CopyToHost(void* dst) const override;
  // Whether a run it was donated to took its memory (XlaArgument::donate):
  // it then holds no value, and reading it fails.
  bool donated() const override;
  // A buffer of the CUDA plugin, for what reads and writes GPU memory
  // outside PJRT (CUDA IPC, worker/cuda_ipc.h; NCCL,
  // worker/nccl_collective.h): the device address of its bytes
  // (PJRT_Buffer_OpaqueDeviceMemoryDataPointer) and the GPU's local
  // hardware id (PJRT_Device_LocalHardwareId: the CUDA ordinal). Awaits the
  // value first. FailedPrecondition for a buffer of another plugin (CPU),
  // one whose on-device size is not its dense size (another layout), or
  // where the plugin does not say.
  bool in_gpu_memory() const override { return memory_ == Memory::kCudaGpu; }
  absl::StatusOr<GpuAddress> gpu_address() const override;
  // The runtime device (client device index) it is on.
  int device() const { return device_; }
  // Whether it belongs to `runtime`'s client (so runs there read it as is).
  bool BelongsTo(const PjrtRuntime& runtime) const;

  // gpu_address, by the name NCCL's code uses.
  using GpuMemory = GpuAddress;
  absl::StatusOr<GpuMemory> Gpu() const { return gpu_address(); }
  // A new buffer of `spec` on the same device of the same client, its
  // bytes undefined (PJRT_Client_CreateUninitializedBuffer), for such a
  // library to fill before anyone reads it (PjrtRuntime::CreateUninitialized
  // on its device). `producer` names it in its errors.
  absl::StatusOr<std::shared_ptr<PjrtBuffer>> NewOnSameDevice(
      const TensorSpec& spec, std::string producer) const;

 private:
  friend class PjrtRuntime;
  // What the plugin's device memory is to this process: host memory (CPU),
  // a CUDA GPU's, or something else Plexus does not address itself.
  enum class Memory { kHost, kCudaGpu, kOther };
  // A buffer of `spec` on `device` (client device index `index`), its
  // bytes undefined: CreateUninitialized and NewOnSameDevice.
  static absl::StatusOr<std::shared_ptr<PjrtBuffer>> Uninitialized(
      std::shared_ptr<PjrtClientHandle> client, PJRT_Device* device, int index,
      Memory memory, const TensorSpec& spec, std::string producer);
  // `producer` names the run that makes it, for its errors.
  PjrtBuffer(std::shared_ptr<PjrtClientHandle> client, PJRT_Buffer* buffer,
             int device, size_t size, Memory memory,
             std::shared_ptr<const std::string> producer)
      : client_(std::move(client)),
        buffer_(buffer),
        device_(device),
        size_(size),
        memory_(memory),
        producer_(std::move(producer)) {}
  std::shared_ptr<PjrtClientHandle> client_;
  PJRT_Buffer* buffer_;
  int device_;
  size_t size_;
  Memory memory_;
  std::shared_ptr<const std::string> producer_;
  // The buffer's ready event (PJRT_Buffer_ReadyEvent), for `scope` to
  // await or the caller to destroy.
  absl::StatusOr<PJRT_Event*> ReadyEventLocked(PjrtScope& scope) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Await's end, its event's wait having said `s`: ready_ (the error named
  // by the run that made it), and the host address where it has one.
  absl::Status SettleLocked(PjrtScope& scope, const absl::Status& s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable std::atomic<const void*> host_address_{nullptr};  // by Await
  mutable absl::Mutex mu_;  // held while the first Await waits
  mutable bool awaited_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Status ready_ ABSL_GUARDED_BY(mu_);
};

// One argument of one partition: its value in host memory, or a device
// buffer (any kind: a PjrtBuffer of this runtime is read as it is).
struct XlaArgument {
  TensorSpec spec;  // local (per-partition)
  const void* host = nullptr;
  const DeviceBuffer* device = nullptr;
  // The caller gives this argument's memory away: where the module aliases
  // it to an output (`tf.aliasing_output`) the output is written over it,
  // and the buffer is then deleted (PjrtBuffer::donated). Honoured only
  // where every partition's argument is a PjrtBuffer of this runtime on
  // its partition's own device (read as it is); every other argument is
  // never written, donated or not.
  bool donate = false;
  // Where a device view of `host` may be kept between runs: the views of
  // the block `host` is the start of (Storage::views), or null. On the CPU
  // plugin, host memory read in place is wrapped in a PJRT buffer once per
  // block and device, not once per run (a put every call reads).
  HostViews* views = nullptr;
};

// How a partition's argument reached its device (store/device_buffer.h's
// TransferPaths count the last two; the worker's timeline records them).
enum class ArgumentRead : uint8_t {
  kHost,            // from host memory (in place on CPU, else copied in)
  kAlias,           // this runtime's buffer on that device, read as it is
  kDeviceToDevice,  // this runtime's buffer on another device, copied over
};

// A compiled program, loaded on a fixed list of devices (its device
// assignment, one device per SPMD partition).
class PjrtExecutable {
 public:
  ~PjrtExecutable();
  PjrtExecutable(const PjrtExecutable&) = delete;
  PjrtExecutable& operator=(const PjrtExecutable&) = delete;

  int num_partitions() const { return static_cast<int>(devices_.size()); }
  // Its device assignment: the runtime device (client device index) of each
  // partition, in partition order.
  const std::vector<int>& device_indices() const { return device_indices_; }
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
  std::vector<int> device_indices_;    // devices_ as client device indices
  std::vector<TensorSpec> outputs_;
  int64_t temp_bytes_ = 0;
};

struct PjrtOptions {
  std::string plugin_path;
  // CPU plugins: how many devices the client creates (one per Plexus device
  // of the worker). Ignored by plugins that count their own devices.
  int cpu_device_count = 1;
  // GPU plugins: the GPUs to use (visible_devices; empty: all). A GPU
  // client never preallocates: it allocates as buffers need memory, which
  // the worker's device budget bounds (the plugin's default would take
  // ~75% of each GPU in every process that opens it).
  std::vector<int64_t> gpus;
  // What compile and load times are measured on (XlaExecutor's counters
  // and log lines); not owned.
  Clock* clock = Clock::Real();
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
  // Host blocks wrapped for a device and kept with them (XlaArgument::views)
  // so far: once per block and device, however many runs read it.
  int64_t host_views_made() const { return host_views_made_.load(); }
  // What device `d` is, in the plugin's words ("cpu", "NVIDIA H200").
  std::string device_kind(int d) const;
  // The memory the plugin lets programs allocate on device `d` (its
  // allocator's limit), or NotFound where the plugin does not say (CPU).
  absl::StatusOr<int64_t> device_memory_limit(int d) const;
  // Whether programs may call jaxlib's LAPACK custom call targets
  // (lapack/lapack_handlers.h: what jnp.linalg lowers to on CPU): OK where
  // their handlers were registered with this CPU plugin; why not otherwise
  // (not a CPU plugin, or one without a PJRT FFI extension that registers
  // handlers). Such a program then fails to compile, naming the target.
  const absl::Status& lapack_handlers() const { return lapack_handlers_; }
  // "<major>.<minor>" of the plugin's PJRT C API.
  std::string api_version() const;
  // The newest StableHLO the plugin reads ("1.13.3": its
  // `stablehlo_current_version` attribute), or empty where it does not say.
  const std::string& stablehlo_version() const { return stablehlo_version_; }
  // The same of the plugin at `path`, without creating a client (it is
  // loaded and initialised, as Load would). Errors name the path.
  static absl::StatusOr<std::string> PluginStableHloVersion(
      const std::string& path);

  // Compiles `module` (StableHLO: MLIR bytecode, text or a portable
  // artifact) with a serialized xla.CompileOptionsProto (its device
  // assignment names this client's device ids).
  absl::StatusOr<std::unique_ptr<PjrtExecutable>> Compile(
      absl::string_view module, absl::string_view compile_options) const;

  // The plugin's serialization of `exe` (PJRT_Executable_Serialize): bytes
  // that Deserialize loads, in a runtime of the same plugin build, without
  // compiling. Errors carry the plugin's message. Of a compiled executable
  // only: the CPU plugin (xla-cpu-pjrt 0.0.1) serializes a deserialized one
  // without its kernels' object code, and that fails to run.
  absl::StatusOr<std::string> Serialize(const PjrtExecutable& exe) const;
  // Loads an executable from Serialize's bytes with `compile_options` (the
  // serialized xla.CompileOptionsProto it was compiled with; its device
  // assignment names this client's device ids). The caller checks that the
  // bytes are those of the (module, options) it wants: the plugin does not.
  absl::StatusOr<std::unique_ptr<PjrtExecutable>> Deserialize(
      absl::string_view serialized, absl::string_view compile_options) const;

  // Whether an input on device `device` (client device index) would be read
  // in place, without a copy: true on CPU for aligned store buffers.
  absl::StatusOr<bool> ReadsInPlace(const builtin::ConstTensor& input,
                                    int device) const;

  // A buffer for a value of `spec` on device `d` whose bytes the caller
  // writes once it is ready (Await; the allocation may wait for work queued
  // before it on the device): a value a peer worker on this host exports by
  // CUDA IPC, copied in at gpu_address. `what` names it in errors
  // ("buffer 12 shard 0 from worker 3").
  // PJRT_Client_CreateUninitializedBuffer.
  absl::StatusOr<std::shared_ptr<PjrtBuffer>> CreateUninitialized(
      int d, const TensorSpec& spec, absl::string_view what) const;

  // A buffer of `spec` on device `d` holding a copy of `host` (the spec's
  // byte size, dense and row-major): a value a client put, or a peer sent
  // through host memory, placed in device memory once, so that every
  // program reading it reads it there (as jax.device_put does) instead of
  // copying it in for each run. The plugin copies the bytes
  // (PJRT_Client_BufferFromHostBuffer); this returns once it has read
  // them, so the caller may free `host`; the buffer is ready when the copy
  // has landed (Await). Counts MemoryTraffic::host_to_device. `what` names
  // it in errors ("buffer 12 shard 0 put by client 3").
  absl::StatusOr<std::shared_ptr<PjrtBuffer>> Upload(
      int d, const TensorSpec& spec, const void* host,
      absl::string_view what) const;

  // Queues one run of `exe` over all its partitions and returns without
  // waiting for it. inputs[p][i] is argument i of partition p (each must
  // stay readable, and `exe` alive, until `done`). Returns outputs[p][o],
  // output o of partition p, in device memory (null where the plugin gave
  // none: the caller reports it): ready when the run has completed; an
  // error of the run (the plugin's message: out of memory, a bad argument)
  // is then every output's (PjrtBuffer::Await), named by `what` (e.g.
  // "program 'f' on worker 3"). An error the plugin gives at once (the run
  // was not queued) is returned, and `done` is then never called. Once
  // queued, `done` is called exactly once, after the run has completed and
  // let go of every input, with the run's status: on the runtime's
  // completion thread, or on this thread before Execute returns where the
  // run had completed by then (the CPU plugin runs small programs inline).
  // It must not block for long (on the completion thread it delays the
  // next run's end).
  using Outputs = std::vector<std::vector<std::shared_ptr<PjrtBuffer>>>;
  // `reads` (optional): (*reads)[p][i], how partition p read argument i,
  // filled where the run was queued.
  using DoneFn = std::function<void(absl::Status)>;
  using ArgumentReads = std::vector<std::vector<ArgumentRead>>;
  absl::StatusOr<Outputs> Execute(
      const PjrtExecutable& exe,
      const std::vector<std::vector<XlaArgument>>& inputs,
      absl::string_view what, DoneFn done,
      ArgumentReads* reads = nullptr) const;
  // Execute with `what` already shared: the outputs keep it as it is (a
  // worker runs a program's calls under one name, made once).
  absl::StatusOr<Outputs> Execute(
      const PjrtExecutable& exe,
      const std::vector<std::vector<XlaArgument>>& inputs,
      std::shared_ptr<const std::string> what, DoneFn done,
      ArgumentReads* reads = nullptr) const;

 private:
  friend class PjrtExecutable;
  friend class PjrtBuffer;
  PjrtRuntime() = default;
  absl::Status Init(const PjrtOptions& options);
  // Creates client_ with the options of the first plugin kind (CPU, then
  // GPU) that takes them, else with the plugin's defaults.
  absl::Status CreateClient(const PjrtOptions& options);
  // Reads a loaded executable's devices, output specs and scratch size.
  absl::StatusOr<std::unique_ptr<PjrtExecutable>> Describe(
      std::unique_ptr<PjrtExecutable> exe) const;
  // The client device index of partition `p` of `exe`.
  int DeviceIndex(const PjrtExecutable& exe, size_t p) const;
  // What the memory of this plugin's buffers is to this process.
  PjrtBuffer::Memory BufferMemory() const;
  // The PJRT buffer partition `device` reads for `arg` (owned by `scope`
  // if made here; host copies it needed kept in `staged`), and how it is
  // read (`read`; kAlias: it is the argument's own PjrtBuffer, so it may
  // be donated).
  // Per-run lists sized for the usual run (one partition, a few arguments
  // and outputs) without an allocation each.
  using Staged = absl::InlinedVector<std::unique_ptr<char[]>, 1>;
  using Views = absl::InlinedVector<std::shared_ptr<const void>, 4>;
  using BufferLists =
      absl::InlinedVector<absl::InlinedVector<PJRT_Buffer*, 4>, 1>;
  absl::StatusOr<PJRT_Buffer*> Argument(PjrtScope& scope,
                                        const XlaArgument& arg,
                                        PJRT_Device* device, Staged* staged,
                                        Views* views, ArgumentRead* read) const;
  // Host memory read in place through the view kept in `arg.views` for
  // `device` (made and kept there first if none is); the run holds it in
  // `views` until its end.
  struct HostView;
  mutable std::atomic<int64_t> host_views_made_{0};
  absl::StatusOr<PJRT_Buffer*> KeptView(const XlaArgument& arg,
                                        PJRT_Device* device,
                                        Views* views) const;

  std::string plugin_path_;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::shared_ptr<PjrtClientHandle> handle_of_client_;  // owns client_
  std::string platform_;
  std::string stablehlo_version_;
  absl::Status lapack_handlers_ = absl::FailedPreconditionError(
      "LAPACK handlers are registered with CPU plugins only");
  std::vector<PJRT_Device*> devices_;  // addressable, by id
  struct Run;  // one queued run, until its end is handled
  // A partition of `run` has completed (a PJRT callback, on a plugin
  // thread: it only counts, and posts the end to completions_).
  static void PartitionDone(PJRT_Error* error, void* run);
  void Finish(Run* run) const;  // on completions_: the end of a run
  // Execute's steps, in order. The PJRT buffers each partition reads (what
  // they need kept in `run`), and the arguments that may not be donated.
  struct BoundArguments {
    BufferLists args;  // by partition
    absl::InlinedVector<int64_t, 4> non_donatable;
  };
  absl::StatusOr<BoundArguments> BindArguments(
      const PjrtExecutable& exe,
      const std::vector<std::vector<XlaArgument>>& inputs, Run& run,
      ArgumentReads* reads) const;
  // Queues the run on the plugin: `outs` gets each partition's outputs
  // (sized by the caller), run.complete each partition's event.
  absl::Status Launch(const PjrtExecutable& exe, BoundArguments& bound,
                      Run& run, BufferLists& outs) const;
  // The outputs as PjrtBuffers made by `what` (null where none was given).
  Outputs WrapOutputs(const PjrtExecutable& exe, const BufferLists& outs,
                      std::shared_ptr<const std::string> what) const;
  // Whether every partition of `run` has completed already (the CPU plugin
  // runs small programs inline); if so, their errors are in run.status.
  bool EndedInline(Run& run) const;
  // Has each partition's end count `run` down: a PJRT callback on its
  // event, else the completion thread waits for it.
  void WatchPartitions(Run* run, const Outputs& result) const;

  // Runs queued and not yet finished: the destructor waits for them.
  mutable absl::Mutex runs_mu_;
  mutable int64_t runs_ ABSL_GUARDED_BY(runs_mu_) = 0;
  // Where each run's end is handled (done callbacks, inputs let go): the
  // plugin's own threads call back, and must not block. Destroyed first,
  // once every run has finished.
  std::unique_ptr<SerialExecutor> completions_;
};

}  // namespace plexus::xla
