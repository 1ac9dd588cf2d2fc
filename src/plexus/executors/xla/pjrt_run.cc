// PjrtRuntime's runs (Execute: queued, their ends handled on the completion
// thread) and the device buffers they make (PjrtBuffer).
#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/xla/internal/pjrt_support.h"
#include "plexus/executors/xla/pjrt_runtime.h"

namespace plexus::xla {

// One queued run: what it reads stays alive until it has completed.
struct PjrtRuntime::Run {
  const PjrtRuntime* runtime = nullptr;
  // The arguments' PJRT buffers made for this run (host memory in place,
  // device-to-device copies) and their zero-copy events.
  std::unique_ptr<PjrtScope> scope;
  // Host copies of device buffers no path here can read.
  Staged staged;
  // Host blocks' views it reads (PjrtRuntime::KeptView).
  Views views;
  absl::InlinedVector<PJRT_Event*, 1> complete;  // one per partition
  std::atomic<int> left{0};                      // partitions not yet complete
  absl::Mutex mu;
  absl::Status status ABSL_GUARDED_BY(mu);
  DoneFn done;
  // The buffers that read `staged` go before it, also on an early return.
  ~Run() { scope.reset(); }
  // A partition's end said `s`: the run's status, the first error kept.
  void Update(const absl::Status& s) {
    if (s.ok()) return;
    absl::MutexLock lock(&mu);
    status.Update(s);
  }
};

absl::StatusOr<PjrtRuntime::Outputs> PjrtRuntime::Execute(
    const PjrtExecutable& exe,
    const std::vector<std::vector<XlaArgument>>& inputs, absl::string_view what,
    DoneFn done, ArgumentReads* reads) const {
  return Execute(exe, inputs, std::make_shared<const std::string>(what),
                 std::move(done), reads);
}

absl::StatusOr<PjrtRuntime::Outputs> PjrtRuntime::Execute(
    const PjrtExecutable& exe,
    const std::vector<std::vector<XlaArgument>>& inputs,
    std::shared_ptr<const std::string> what, DoneFn done,
    ArgumentReads* reads) const {
  const size_t parts = exe.devices_.size();
  if (inputs.size() != parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the executable runs on ", parts, " devices, given ", inputs.size()));
  }
  auto run = std::make_unique<Run>();
  run->runtime = this;
  run->scope = std::make_unique<PjrtScope>(api_);
  absl::StatusOr<BoundArguments> bound =
      BindArguments(exe, inputs, *run, reads);
  if (!bound.ok()) return bound.status();
  BufferLists outs(parts, absl::InlinedVector<PJRT_Buffer*, 4>(
                              exe.outputs_.size(), nullptr));
  if (absl::Status s = Launch(exe, *bound, *run, outs); !s.ok()) return s;
  // Queued: from here `done` is called, once, whatever else happens. The
  // outputs are ours (freed with their PjrtBuffer), each ready once the run
  // that makes it has completed; one the plugin did not give is null, for
  // the caller to report.
  Outputs result = WrapOutputs(exe, outs, std::move(what));
  // Its end: each partition's completion counts down, the last hands the
  // run to the completion thread.
  run->done = std::move(done);
  {
    absl::MutexLock lock(&runs_mu_);
    ++runs_;
  }
  Run* queued = run.release();
  queued->left = static_cast<int>(parts);
  // A run that has already completed (the CPU plugin runs small programs
  // inline, inside Execute) ends here, on this thread: no hand-off.
  if (EndedInline(*queued)) {
    Finish(queued);
    return result;
  }
  WatchPartitions(queued, result);
  return result;
}

absl::StatusOr<PjrtRuntime::BoundArguments> PjrtRuntime::BindArguments(
    const PjrtExecutable& exe,
    const std::vector<std::vector<XlaArgument>>& inputs, Run& run,
    ArgumentReads* reads) const {
  const size_t parts = exe.devices_.size();
  const size_t num_args = parts == 0 ? 0 : inputs[0].size();
  BoundArguments bound;
  bound.args.resize(parts);
  // Argument i may be donated only if every partition's is its own buffer
  // and donated; the plugin takes one list for all partitions.
  absl::InlinedVector<bool, 8> donatable(num_args, parts > 0);
  if (reads != nullptr) reads->assign(parts, {});
  for (size_t p = 0; p < parts; ++p) {
    bound.args[p].reserve(num_args);
    if (reads != nullptr) (*reads)[p].reserve(num_args);
    if (inputs[p].size() != num_args) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p, ": ", inputs[p].size(),
                       " inputs, partition 0 has ", num_args));
    }
    for (size_t i = 0; i < num_args; ++i) {
      ArgumentRead read = ArgumentRead::kHost;
      absl::StatusOr<PJRT_Buffer*> buffer =
          Argument(*run.scope, inputs[p][i], exe.devices_[p], &run.staged,
                   &run.views, &read);
      if (!buffer.ok()) {
        return absl::Status(
            buffer.status().code(),
            absl::StrCat("argument ", i, ": ", buffer.status().message()));
      }
      bound.args[p].push_back(*buffer);
      if (!(read == ArgumentRead::kAlias && inputs[p][i].donate)) {
        donatable[i] = false;
      }
      if (reads != nullptr) (*reads)[p].push_back(read);
    }
  }
  // Without this list the plugin would write an aliased output over any
  // argument: a value the store still holds, or host memory read in place.
  for (size_t i = 0; i < num_args; ++i) {
    if (!donatable[i]) bound.non_donatable.push_back(static_cast<int64_t>(i));
  }
  return bound;
}

absl::Status PjrtRuntime::Launch(const PjrtExecutable& exe,
                                 BoundArguments& bound, Run& run,
                                 BufferLists& outs) const {
  const size_t parts = exe.devices_.size();
  absl::InlinedVector<PJRT_Buffer* const*, 1> arg_lists(parts);
  absl::InlinedVector<PJRT_Buffer**, 1> out_lists(parts);
  for (size_t p = 0; p < parts; ++p) {
    arg_lists[p] = bound.args[p].data();
    out_lists[p] = outs[p].data();
  }
  run.complete.assign(parts, nullptr);
  static std::atomic<int> launch_id{1};
  auto opts = PJRT_ARGS(PJRT_ExecuteOptions);
  opts.launch_id = launch_id.fetch_add(1);
  opts.non_donatable_input_indices = bound.non_donatable.data();
  opts.num_non_donatable_input_indices = bound.non_donatable.size();
  auto ex = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  ex.executable = exe.exe_;
  ex.options = &opts;
  ex.argument_lists = arg_lists.data();
  ex.num_devices = parts;
  ex.num_args = parts == 0 ? 0 : bound.args[0].size();
  ex.output_lists = out_lists.data();
  ex.device_complete_events = run.complete.data();
  return run.scope->ToStatus(api_->PJRT_LoadedExecutable_Execute(&ex),
                             "XLA execute");
}

PjrtRuntime::Outputs PjrtRuntime::WrapOutputs(
    const PjrtExecutable& exe, const BufferLists& outs,
    std::shared_ptr<const std::string> producer) const {
  Outputs result(outs.size());
  for (size_t p = 0; p < outs.size(); ++p) {
    for (size_t o = 0; o < outs[p].size(); ++o) {
      result[p].push_back(
          outs[p][o] == nullptr
              ? nullptr
              : std::shared_ptr<PjrtBuffer>(new PjrtBuffer(
                    handle_of_client_, outs[p][o], DeviceIndex(exe, p),
                    exe.outputs_[o].byte_size(), BufferMemory(), producer)));
    }
  }
  return result;
}

bool PjrtRuntime::EndedInline(Run& run) const {
  PjrtScope& scope = *run.scope;
  for (PJRT_Event* e : run.complete) {
    auto ready = PJRT_ARGS(PJRT_Event_IsReady_Args);
    ready.event = e;
    if (e == nullptr) return false;  // said by WatchPartitions
    if (PJRT_Error* error = api_->PJRT_Event_IsReady(&ready)) {
      scope.ToStatus(error, "").IgnoreError();
      return false;
    }
    if (!ready.is_ready) return false;
  }
  for (PJRT_Event* e : run.complete) {
    auto error = PJRT_ARGS(PJRT_Event_Error_Args);
    error.event = e;
    run.Update(scope.ToStatus(api_->PJRT_Event_Error(&error), "XLA execution"));
  }
  return true;
}

void PjrtRuntime::WatchPartitions(Run* queued, const Outputs& result) const {
  // Once the last partition's watch is registered, its completion may
  // fire at once and the completion thread free the run: nothing here
  // reads `queued` after the last registration (the count is read first;
  // each partition's event before its own registration, when the run
  // still waits for it).
  const size_t parts = queued->complete.size();
  for (size_t p = 0; p < parts; ++p) {
    auto on = PJRT_ARGS(PJRT_Event_OnReady_Args);
    on.event = queued->complete[p];
    on.callback = &PjrtRuntime::PartitionDone;
    on.user_arg = queued;
    PJRT_Error* refused = nullptr;
    if (on.event != nullptr) {
      refused = api_->PJRT_Event_OnReady(&on);
      if (refused == nullptr) continue;  // the usual path
      PjrtScope(api_).ToStatus(refused, "").IgnoreError();
    }
    // No event, or no callback on it (neither seen): the completion
    // thread waits for the partition's end (its event, else its outputs'
    // ready events), never this one.
    PJRT_Event* event = on.event;
    std::vector<std::shared_ptr<PjrtBuffer>> outputs = result[p];
    completions_->Post([this, queued, event, outputs] {
      PjrtScope scope(api_);
      absl::Status s;
      if (event != nullptr) {
        auto a = PJRT_ARGS(PJRT_Event_Await_Args);
        a.event = event;
        s = scope.ToStatus(api_->PJRT_Event_Await(&a), "XLA execution");
      } else {
        for (const auto& out : outputs) {
          if (out != nullptr) s.Update(out->Await());
        }
      }
      queued->Update(s);
      PartitionDone(nullptr, queued);
    });
  }
}

void PjrtRuntime::PartitionDone(PJRT_Error* error, void* arg) {
  Run* run = static_cast<Run*>(arg);
  const PjrtRuntime* runtime = run->runtime;
  run->Update(PjrtScope(runtime->api_).ToStatus(error, "XLA execution"));
  if (run->left.fetch_sub(1) == 1) {
    runtime->completions_->Post([runtime, run] { runtime->Finish(run); });
  }
}

void PjrtRuntime::Finish(Run* run) const {
  std::unique_ptr<Run> owned(run);
  for (PJRT_Event* e : run->complete) {
    if (e == nullptr) continue;
    auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
    d.event = e;
    run->scope->ToStatus(api_->PJRT_Event_Destroy(&d), "").IgnoreError();
  }
  // The arguments' buffers go, and host memory read in place is let go
  // (the scope waits for the plugin's word on each), before `done` says
  // the inputs may be freed.
  run->scope.reset();
  run->staged.clear();
  run->views.clear();
  absl::Status status;
  {
    absl::MutexLock lock(&run->mu);
    status = run->status;
  }
  if (run->done) run->done(status);
  owned.reset();
  absl::MutexLock lock(&runs_mu_);
  --runs_;
}

// A host block's zero-copy PJRT buffer, kept with the block (HostViews).
struct PjrtRuntime::HostView {
  std::shared_ptr<PjrtClientHandle> client;  // outlives `scope`
  // Owns the buffer: destroys it, then waits until the plugin is done with
  // the block's bytes.
  std::unique_ptr<PjrtScope> scope;
  PJRT_Buffer* buffer = nullptr;
};

absl::StatusOr<PJRT_Buffer*> PjrtRuntime::KeptView(const XlaArgument& arg,
                                                   PJRT_Device* device,
                                                   Views* views) const {
  // Keyed by this runtime's client, which the view keeps alive: every view
  // under this key is a HostView made here.
  HostViews::Key key{handle_of_client_.get(), device, arg.spec};
  std::shared_ptr<const void> view = arg.views->Find(key);
  if (view == nullptr) {
    auto made = std::make_shared<HostView>();
    made->client = handle_of_client_;
    made->scope = std::make_unique<PjrtScope>(api_);
    auto buffer = HostBuffer(api_, client_, /*host_memory=*/true, *made->scope,
                             {arg.spec, arg.host}, device);
    if (!buffer.ok()) return buffer.status();
    made->buffer = *buffer;
    host_views_made_++;
    view = arg.views->Keep(std::move(key), std::move(made));
  }
  views->push_back(view);
  return static_cast<const HostView*>(view.get())->buffer;
}

absl::StatusOr<PJRT_Buffer*> PjrtRuntime::Argument(PjrtScope& scope,
                                                   const XlaArgument& arg,
                                                   PJRT_Device* device,
                                                   Staged* staged, Views* views,
                                                   ArgumentRead* read) const {
  *read = ArgumentRead::kHost;
  const auto* mine = dynamic_cast<const PjrtBuffer*>(arg.device);
  if (mine != nullptr && mine->BelongsTo(*this)) {
    if (mine->size() != arg.spec.byte_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a device buffer of ", mine->size(), " bytes for ",
                       arg.spec.ToString()));
    }
    if (mine->device() < 0 || mine->device() >= num_devices()) {
      return absl::InternalError(
          absl::StrCat("a device buffer on unknown device ", mine->device()));
    }
    if (devices_[mine->device()] == device) {
      TransferPaths::alias()++;
      TransferBytes::Add(TransferBytes::kAlias,
                         static_cast<int64_t>(mine->size()));
      *read = ArgumentRead::kAlias;
      return mine->buffer_;
    }
    // Another device of this client: the plugin's device-to-device copy.
    auto copy = PJRT_ARGS(PJRT_Buffer_CopyToDevice_Args);
    copy.buffer = mine->buffer_;
    copy.dst_device = device;
    if (absl::Status s = scope.ToStatus(api_->PJRT_Buffer_CopyToDevice(&copy),
                                        "device-to-device copy");
        !s.ok()) {
      return s;
    }
    scope.Own(copy.dst_buffer);
    TransferPaths::device_to_device()++;
    TransferBytes::Add(TransferBytes::kDeviceToDevice,
                       static_cast<int64_t>(mine->size()));
    *read = ArgumentRead::kDeviceToDevice;
    return copy.dst_buffer;
  }
  const void* host = arg.host;
  if (host == nullptr && arg.device != nullptr) {
    if (absl::Status s = arg.device->Await(); !s.ok()) return s;
    host = arg.device->host_address();
    if (host == nullptr) {  // another runtime's device memory: via the host
      staged->push_back(std::make_unique<char[]>(arg.device->size()));
      if (absl::Status s = arg.device->CopyToHost(staged->back().get());
          !s.ok()) {
        return s;
      }
      host = staged->back().get();
    }
  }
  const bool in_place = platform_ == "cpu";
  if (in_place && arg.views != nullptr && host == arg.host) {
    return KeptView(arg, device, views);
  }
  auto buffer =
      HostBuffer(api_, client_, in_place, scope, {arg.spec, host}, device);
  if (buffer.ok() && !in_place) {
    MemoryTraffic::host_to_device() += arg.spec.byte_size();
  }
  return buffer;
}

PjrtBuffer::~PjrtBuffer() {
  auto a = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  a.buffer = buffer_;
  PjrtScope(client_->api)
      .ToStatus(client_->api->PJRT_Buffer_Destroy(&a), "")
      .IgnoreError();
}

bool PjrtBuffer::donated() const {
  auto a = PJRT_ARGS(PJRT_Buffer_IsDeleted_Args);
  a.buffer = buffer_;
  return PjrtScope(client_->api)
             .ToStatus(client_->api->PJRT_Buffer_IsDeleted(&a), "")
             .ok() &&
         a.is_deleted;
}

PjrtBuffer::Memory PjrtRuntime::BufferMemory() const {
  if (platform_ == "cpu") return PjrtBuffer::Memory::kHost;
  if (platform_ == "cuda") return PjrtBuffer::Memory::kCudaGpu;
  return PjrtBuffer::Memory::kOther;
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtRuntime::CreateUninitialized(
    int d, const TensorSpec& spec, absl::string_view what) const {
  if (d < 0 || d >= num_devices()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no device ", d, " in this PJRT client"));
  }
  return PjrtBuffer::Uninitialized(handle_of_client_, devices_[d], d,
                                   BufferMemory(), spec, std::string(what));
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtRuntime::Upload(
    int d, const TensorSpec& spec, const void* host,
    absl::string_view what) const {
  if (d < 0 || d >= num_devices()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no device ", d, " in this PJRT client"));
  }
  absl::StatusOr<PJRT_Buffer_Type> type = BufferType(spec.dtype);
  if (!type.ok()) return type.status();
  PjrtScope scope(api_);
  auto a = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client_;
  a.data = host;
  a.type = *type;
  a.dims = spec.shape.data();
  a.num_dims = spec.shape.size();
  a.host_buffer_semantics =
      PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  a.device = devices_[d];
  if (absl::Status s = scope.ToStatus(
          api_->PJRT_Client_BufferFromHostBuffer(&a),
          absl::StrCat(what, ": copying ", spec.ToString(), " to device"));
      !s.ok()) {
    return s;
  }
  auto buffer = std::shared_ptr<PjrtBuffer>(new PjrtBuffer(
      handle_of_client_, a.buffer, d, static_cast<size_t>(spec.byte_size()),
      BufferMemory(), std::make_shared<const std::string>(what)));
  if (a.done_with_host_buffer != nullptr) {
    if (absl::Status s = scope.Await(a.done_with_host_buffer); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
  }
  MemoryTraffic::host_to_device() += spec.byte_size();
  return buffer;
}

bool PjrtBuffer::BelongsTo(const PjrtRuntime& runtime) const {
  return client_ == runtime.handle_of_client_;
}

absl::StatusOr<PJRT_Event*> PjrtBuffer::ReadyEventLocked(
    PjrtScope& scope) const {
  auto ready = PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer_;
  absl::Status s = scope.ToStatus(client_->api->PJRT_Buffer_ReadyEvent(&ready),
                                  "output ready event");
  if (!s.ok()) return s;
  return ready.event;
}

absl::Status PjrtBuffer::SettleLocked(PjrtScope& scope,
                                      const absl::Status& s) const {
  const PJRT_Api* api = client_->api;
  if (!s.ok()) {
    ready_ =
        absl::Status(s.code(), absl::StrCat(*producer_, ": ", s.message()));
  } else if (memory_ == Memory::kHost) {
    // The CPU plugin's buffers are host memory; its default layout is
    // dense and row-major, which the size confirms. Else read through
    // CopyToHost.
    auto bytes = PJRT_ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args);
    bytes.buffer = buffer_;
    auto p = PJRT_ARGS(PJRT_Buffer_UnsafePointer_Args);
    p.buffer = buffer_;
    if (scope.ToStatus(api->PJRT_Buffer_OnDeviceSizeInBytes(&bytes), "").ok() &&
        bytes.on_device_size_in_bytes == size_ &&
        scope.ToStatus(api->PJRT_Buffer_UnsafePointer(&p), "").ok()) {
      host_address_.store(reinterpret_cast<const void*>(p.buffer_pointer),
                          std::memory_order_release);
    }
  }
  awaited_ = true;
  return ready_;
}

absl::Status PjrtBuffer::Await() const {
  absl::MutexLock lock(&mu_);
  if (awaited_) return ready_;
  PjrtScope scope(client_->api);
  absl::StatusOr<PJRT_Event*> event = ReadyEventLocked(scope);
  return SettleLocked(scope, event.ok() ? scope.Await(*event) : event.status());
}

std::optional<absl::Status> PjrtBuffer::Computed() const {
  absl::MutexLock lock(&mu_);
  if (awaited_) return ready_;
  const PJRT_Api* api = client_->api;
  PjrtScope scope(api);
  absl::StatusOr<PJRT_Event*> event = ReadyEventLocked(scope);
  if (!event.ok()) return std::nullopt;  // Await says why
  auto is = PJRT_ARGS(PJRT_Event_IsReady_Args);
  is.event = *event;
  if (!scope.ToStatus(api->PJRT_Event_IsReady(&is), "").ok() || !is.is_ready) {
    auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
    d.event = *event;
    scope.ToStatus(api->PJRT_Event_Destroy(&d), "").IgnoreError();
    return std::nullopt;
  }
  return SettleLocked(scope, scope.Await(*event));  // ready: at once
}

absl::Status PjrtBuffer::CopyToHost(void* dst) const {
  if (absl::Status s = Await(); !s.ok()) return s;
  const PJRT_Api* api = client_->api;
  PjrtScope scope(api);
  auto t = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  t.src = buffer_;
  t.dst = dst;
  t.dst_size = size_;
  if (absl::Status s =
          scope.ToStatus(api->PJRT_Buffer_ToHostBuffer(&t), "copy to host");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = scope.Await(t.event); !s.ok()) return s;
  MemoryTraffic::device_to_host() += size_;
  return absl::OkStatus();
}

}  // namespace plexus::xla

namespace plexus::xla {
namespace {
// Whether the plugin's PJRT_Api has `offset`'s function (a plugin built
// against an older header has a shorter struct).
bool Has(const PJRT_Api* api, size_t offset, const void* fn) {
  return offset < api->struct_size && fn != nullptr;
}
#define PLEXUS_PJRT_HAS(api, name) \
  Has(api, offsetof(PJRT_Api, name), reinterpret_cast<const void*>(api->name))
}  // namespace

absl::StatusOr<GpuAddress> PjrtBuffer::gpu_address() const {
  if (memory_ != Memory::kCudaGpu) {
    return absl::FailedPreconditionError(
        "not in GPU memory (a buffer of a PJRT plugin that is not CUDA's)");
  }
  if (absl::Status s = Await(); !s.ok()) return s;
  const PJRT_Api* api = client_->api;
  if (!PLEXUS_PJRT_HAS(api, PJRT_Buffer_OpaqueDeviceMemoryDataPointer) ||
      !PLEXUS_PJRT_HAS(api, PJRT_Device_LocalHardwareId)) {
    return absl::FailedPreconditionError(
        "the PJRT plugin gives no device pointers");
  }
  PjrtScope scope(api);
  auto bytes = PJRT_ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args);
  bytes.buffer = buffer_;
  if (absl::Status s = scope.ToStatus(
          api->PJRT_Buffer_OnDeviceSizeInBytes(&bytes), "on-device size");
      !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  if (bytes.on_device_size_in_bytes != size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the buffer holds ", bytes.on_device_size_in_bytes,
                     " bytes on its device, not its dense ", size_));
  }
  auto ptr = PJRT_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
  ptr.buffer = buffer_;
  auto dev = PJRT_ARGS(PJRT_Buffer_Device_Args);
  dev.buffer = buffer_;
  if (absl::Status s =
          scope.ToStatus(api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&ptr),
                         "device pointer");
      !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  if (absl::Status s =
          scope.ToStatus(api->PJRT_Buffer_Device(&dev), "buffer device");
      !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  auto hw = PJRT_ARGS(PJRT_Device_LocalHardwareId_Args);
  hw.device = dev.device;
  if (absl::Status s = scope.ToStatus(api->PJRT_Device_LocalHardwareId(&hw),
                                      "local hardware id");
      !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  if (hw.local_hardware_id < 0) {
    return absl::FailedPreconditionError(
        "the plugin gives the device no hardware id");
  }
  return GpuAddress{ptr.device_memory_ptr, hw.local_hardware_id};
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtBuffer::NewOnSameDevice(
    const TensorSpec& spec, std::string producer) const {
  PjrtScope scope(client_->api);
  auto dev = PJRT_ARGS(PJRT_Buffer_Device_Args);
  dev.buffer = buffer_;
  if (absl::Status s = scope.ToStatus(client_->api->PJRT_Buffer_Device(&dev),
                                      "buffer device");
      !s.ok()) {
    return s;
  }
  return Uninitialized(client_, dev.device, device_, memory_, spec,
                       std::move(producer));
}

absl::StatusOr<std::shared_ptr<PjrtBuffer>> PjrtBuffer::Uninitialized(
    std::shared_ptr<PjrtClientHandle> client, PJRT_Device* device, int index,
    Memory memory, const TensorSpec& spec, std::string producer) {
  const PJRT_Api* api = client->api;
  if (!PLEXUS_PJRT_HAS(api, PJRT_Client_CreateUninitializedBuffer)) {
    return absl::FailedPreconditionError(absl::StrCat(
        producer, ": the PJRT plugin cannot allocate uninitialized buffers"));
  }
  absl::StatusOr<PJRT_Buffer_Type> type = BufferType(spec.dtype);
  if (!type.ok()) return type.status();
  PjrtScope scope(api);
  auto a = PJRT_ARGS(PJRT_Client_CreateUninitializedBuffer_Args);
  a.client = client->client;
  a.shape_dims = spec.shape.data();
  a.shape_num_dims = spec.shape.size();
  a.shape_element_type = *type;
  a.device = device;
  if (absl::Status s = scope.ToStatus(
          api->PJRT_Client_CreateUninitializedBuffer(&a),
          absl::StrCat(producer, ": allocating ", spec.ToString()));
      !s.ok()) {
    return s;
  }
  return std::shared_ptr<PjrtBuffer>(new PjrtBuffer(
      std::move(client), a.buffer, index, static_cast<size_t>(spec.byte_size()),
      memory, std::make_shared<const std::string>(std::move(producer))));
}

}  // namespace plexus::xla
