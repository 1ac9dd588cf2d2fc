#include "plexus/executors/xla/pjrt_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pjrt_c_api.h"  // from the xla-cpu-pjrt wheel (CMakeLists.txt)

namespace plexus::xla {
namespace {

// Zero-initialised PJRT argument struct with its size set, as the C API
// requires for forward and backward compatibility.
template <typename T>
T Args(size_t struct_size) {
  T args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = struct_size;
  return args;
}
#define PJRT_ARGS(type) Args<type>(type##_STRUCT_SIZE)

absl::StatusCode CodeOf(PJRT_Error_Code code) {
  switch (code) {
    case PJRT_Error_Code_CANCELLED:
      return absl::StatusCode::kCancelled;
    case PJRT_Error_Code_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case PJRT_Error_Code_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case PJRT_Error_Code_RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    case PJRT_Error_Code_FAILED_PRECONDITION:
      return absl::StatusCode::kFailedPrecondition;
    case PJRT_Error_Code_UNIMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case PJRT_Error_Code_UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

// Plexus dtypes and PJRT element types, one to one.
constexpr std::pair<DType, PJRT_Buffer_Type> kTypes[] = {
    {DType::kF32, PJRT_Buffer_Type_F32},
    {DType::kF64, PJRT_Buffer_Type_F64},
    {DType::kI32, PJRT_Buffer_Type_S32},
    {DType::kI64, PJRT_Buffer_Type_S64},
    {DType::kBF16, PJRT_Buffer_Type_BF16},
    {DType::kF16, PJRT_Buffer_Type_F16},
    {DType::kI8, PJRT_Buffer_Type_S8},
    {DType::kU8, PJRT_Buffer_Type_U8},
    {DType::kBool, PJRT_Buffer_Type_PRED},
    {DType::kI16, PJRT_Buffer_Type_S16},
    {DType::kU16, PJRT_Buffer_Type_U16},
    {DType::kU32, PJRT_Buffer_Type_U32},
    {DType::kU64, PJRT_Buffer_Type_U64},
    {DType::kC64, PJRT_Buffer_Type_C64},
    {DType::kC128, PJRT_Buffer_Type_C128},
    {DType::kF8E5M2, PJRT_Buffer_Type_F8E5M2},
    {DType::kF8E4M3FN, PJRT_Buffer_Type_F8E4M3FN},
    {DType::kF8E4M3B11FNUZ, PJRT_Buffer_Type_F8E4M3B11FNUZ},
    {DType::kF8E5M2FNUZ, PJRT_Buffer_Type_F8E5M2FNUZ},
    {DType::kF8E4M3FNUZ, PJRT_Buffer_Type_F8E4M3FNUZ},
    {DType::kF8E4M3, PJRT_Buffer_Type_F8E4M3},
    {DType::kF8E3M4, PJRT_Buffer_Type_F8E3M4},
    {DType::kF8E8M0FNU, PJRT_Buffer_Type_F8E8M0FNU},
};

absl::StatusOr<PJRT_Buffer_Type> BufferType(DType dtype) {
  for (const auto& [d, t] : kTypes) {
    if (d == dtype) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", DTypeName(dtype), " has no XLA element type"));
}

absl::StatusOr<DType> FromBufferType(PJRT_Buffer_Type type) {
  for (const auto& [d, t] : kTypes) {
    if (t == type) return d;
  }
  return absl::UnimplementedError(
      absl::StrCat("XLA element type ", static_cast<int>(type),
                   " has no Plexus dtype (Plexus takes every whole-byte dtype; "
                   "sub-byte ones such as int4 are not)"));
}

}  // namespace

// Owns PJRT objects created during one call and destroys them in order.
class PjrtScope {
 public:
  explicit PjrtScope(const PJRT_Api* api) : api_(api) {}
  ~PjrtScope() {
    for (PJRT_Buffer* b : buffers_) {
      auto a = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
      a.buffer = b;
      Consume(api_->PJRT_Buffer_Destroy(&a));
    }
    // Zero-copy inputs: the host memory is ours again once the plugin is
    // done with it.
    for (PJRT_Event* e : host_done_) {
      Await(e).IgnoreError();
    }
  }
  void Own(PJRT_Buffer* b) { buffers_.push_back(b); }
  void HostDone(PJRT_Event* e) {
    if (e != nullptr) host_done_.push_back(e);
  }
  absl::Status ToStatus(PJRT_Error* error, absl::string_view what) const {
    if (error == nullptr) return absl::OkStatus();
    auto m = PJRT_ARGS(PJRT_Error_Message_Args);
    m.error = error;
    api_->PJRT_Error_Message(&m);
    auto c = PJRT_ARGS(PJRT_Error_GetCode_Args);
    c.error = error;
    PJRT_Error* code_error = api_->PJRT_Error_GetCode(&c);
    absl::StatusCode code =
        code_error == nullptr ? CodeOf(c.code) : absl::StatusCode::kInternal;
    absl::Status s(
        code,
        absl::StrCat(what, ": ", absl::string_view(m.message, m.message_size)));
    Consume(code_error);
    Consume(error);
    return s;
  }
  // Waits for `event`, then destroys it.
  absl::Status Await(PJRT_Event* event) const {
    auto a = PJRT_ARGS(PJRT_Event_Await_Args);
    a.event = event;
    absl::Status s = ToStatus(api_->PJRT_Event_Await(&a), "XLA execution");
    auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
    d.event = event;
    Consume(api_->PJRT_Event_Destroy(&d));
    return s;
  }

 private:
  void Consume(PJRT_Error* error) const {
    if (error == nullptr) return;
    auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
    d.error = error;
    api_->PJRT_Error_Destroy(&d);
  }
  const PJRT_Api* api_;
  std::vector<PJRT_Buffer*> buffers_;
  std::vector<PJRT_Event*> host_done_;
};

namespace {

// A PJRT buffer on `device` over `input`'s host memory, owned by `scope`.
// Store buffers are immutable while a task reads them: a plugin whose
// devices address host memory (CPU) uses them in place until it signals
// done_with_host_buffer; others copy them to the device, from the same
// memory, before signalling.
absl::StatusOr<PJRT_Buffer*> HostBuffer(const PJRT_Api* api,
                                        PJRT_Client* client, bool host_memory,
                                        PjrtScope& scope,
                                        const builtin::ConstTensor& input,
                                        PJRT_Device* device) {
  auto type = BufferType(input.spec.dtype);
  if (!type.ok()) return type.status();
  auto a = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client;
  a.data = input.data;
  a.type = *type;
  a.dims = input.spec.shape.data();
  a.num_dims = input.spec.shape.size();
  a.host_buffer_semantics =
      host_memory ? PJRT_HostBufferSemantics_kImmutableZeroCopy
                  : PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  a.device = device;
  if (absl::Status s = scope.ToStatus(api->PJRT_Client_BufferFromHostBuffer(&a),
                                      "to device");
      !s.ok()) {
    return s;
  }
  scope.Own(a.buffer);
  scope.HostDone(a.done_with_host_buffer);
  return a.buffer;
}

}  // namespace

// The PJRT client, destroyed with the last of its runtime and its buffers.
struct PjrtClientHandle {
  PjrtClientHandle(const PJRT_Api* api, PJRT_Client* client)
      : api(api), client(client) {}
  ~PjrtClientHandle() {
    auto a = PJRT_ARGS(PJRT_Client_Destroy_Args);
    a.client = client;
    PjrtScope(api).ToStatus(api->PJRT_Client_Destroy(&a), "").IgnoreError();
  }
  const PJRT_Api* const api;
  PJRT_Client* const client;
};

PjrtExecutable::~PjrtExecutable() {
  auto a = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = exe_;
  PjrtScope(runtime_->api_)
      .ToStatus(runtime_->api_->PJRT_LoadedExecutable_Destroy(&a), "")
      .IgnoreError();
}

absl::StatusOr<std::unique_ptr<PjrtRuntime>> PjrtRuntime::Load(
    const PjrtOptions& options) {
  std::unique_ptr<PjrtRuntime> runtime(new PjrtRuntime());
  absl::Status s = runtime->Init(options);
  if (!s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat("PJRT plugin '", options.plugin_path, "': ", s.message()));
  }
  return runtime;
}

absl::Status PjrtRuntime::Init(const PjrtOptions& options) {
  plugin_path_ = options.plugin_path;
  if (plugin_path_.empty()) {
    return absl::FailedPreconditionError(
        "no plugin configured (plexus-worker --pjrt-plugin or "
        "PLEXUS_PJRT_PLUGIN); scripts/setup.sh installs xla-cpu-pjrt");
  }
  // RTLD_LOCAL: the plugin keeps its own protobuf, abseil and LLVM.
  handle_ = dlopen(plugin_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot load: ", dlerror()));
  }
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle_, "GetPjrtApi"));
  if (get_api == nullptr) {
    return absl::InvalidArgumentError("not a PJRT plugin: no GetPjrtApi");
  }
  api_ = get_api();
  if (api_ == nullptr) return absl::InternalError("GetPjrtApi returned null");
  const auto& v = api_->pjrt_api_version;
  if (v.major_version != PJRT_API_MAJOR) {
    return absl::FailedPreconditionError(
        absl::StrCat("PJRT C API ", v.major_version, ".", v.minor_version,
                     " is incompatible with the ", PJRT_API_MAJOR, ".",
                     PJRT_API_MINOR, " Plexus was built against"));
  }
  PjrtScope scope(api_);
  auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  if (absl::Status s =
          scope.ToStatus(api_->PJRT_Plugin_Initialize(&init), "initialise");
      !s.ok()) {
    return s;
  }
  // The options of the CPU plugin, then of the GPU ones: each plugin
  // refuses the options it does not know, so the first it takes wins.
  // A create option: its name and type; the caller sets the value.
  auto option = [](const char* name, PJRT_NamedValue_Type type,
                   size_t value_size = 1) {
    PJRT_NamedValue v;
    std::memset(&v, 0, sizeof(v));
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = name;
    v.name_size = std::strlen(name);
    v.type = type;
    v.value_size = value_size;
    return v;
  };
  std::vector<PJRT_NamedValue> cpu = {
      option("cpu_device_count", PJRT_NamedValue_kInt64)};
  cpu[0].int64_value = options.cpu_device_count;
  std::vector<PJRT_NamedValue> gpu = {
      option("preallocate", PJRT_NamedValue_kBool)};
  gpu[0].bool_value = false;
  if (!options.gpus.empty()) {
    gpu.push_back(option("visible_devices", PJRT_NamedValue_kInt64List,
                         options.gpus.size()));
    gpu.back().int64_array_value = options.gpus.data();
  }
  auto create = PJRT_ARGS(PJRT_Client_Create_Args);
  absl::Status created;
  for (const std::vector<PJRT_NamedValue>* named : {&cpu, &gpu}) {
    create = PJRT_ARGS(PJRT_Client_Create_Args);
    create.create_options = named->data();
    create.num_options = named->size();
    created =
        scope.ToStatus(api_->PJRT_Client_Create(&create), "create client");
    if (created.ok()) break;
  }
  if (!created.ok()) {
    // A plugin that knows neither: its defaults.
    create = PJRT_ARGS(PJRT_Client_Create_Args);
    if (absl::Status s =
            scope.ToStatus(api_->PJRT_Client_Create(&create), "create client");
        !s.ok()) {
      return s;
    }
  }
  client_ = create.client;
  handle_of_client_ = std::make_shared<PjrtClientHandle>(api_, client_);
  auto name = PJRT_ARGS(PJRT_Client_PlatformName_Args);
  name.client = client_;
  if (absl::Status s = scope.ToStatus(api_->PJRT_Client_PlatformName(&name),
                                      "platform name");
      !s.ok()) {
    return s;
  }
  platform_.assign(name.platform_name, name.platform_name_size);
  auto devs = PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  devs.client = client_;
  if (absl::Status s = scope.ToStatus(
          api_->PJRT_Client_AddressableDevices(&devs), "list devices");
      !s.ok()) {
    return s;
  }
  devices_.assign(devs.addressable_devices,
                  devs.addressable_devices + devs.num_addressable_devices);
  completions_ = std::make_unique<SerialExecutor>("plexus-xla-done");
  return absl::OkStatus();
}

PjrtRuntime::~PjrtRuntime() {
  // Every queued run ends (XLA runs cannot be cancelled), and its end is
  // handled, before the completion thread goes.
  {
    absl::MutexLock lock(&runs_mu_);
    auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(runs_mu_) {
      return runs_ == 0;
    };
    runs_mu_.Await(absl::Condition(&finished));
  }
  completions_.reset();
  // The client goes with handle_of_client_, once no buffer of it is left.
  // The plugin stays mapped: its static destructors and threads may still
  // run at exit, and unloading XLA is not supported.
}

std::string PjrtRuntime::api_version() const {
  return absl::StrCat(api_->pjrt_api_version.major_version, ".",
                      api_->pjrt_api_version.minor_version);
}

std::string PjrtRuntime::device_kind(int d) const {
  if (d < 0 || d >= num_devices()) return "";
  PjrtScope scope(api_);
  auto desc = PJRT_ARGS(PJRT_Device_GetDescription_Args);
  desc.device = devices_[d];
  if (!scope.ToStatus(api_->PJRT_Device_GetDescription(&desc), "").ok()) {
    return platform_;
  }
  auto kind = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  kind.device_description = desc.device_description;
  if (!scope.ToStatus(api_->PJRT_DeviceDescription_Kind(&kind), "").ok()) {
    return platform_;
  }
  return std::string(kind.device_kind, kind.device_kind_size);
}

absl::StatusOr<int64_t> PjrtRuntime::device_memory_limit(int d) const {
  if (d < 0 || d >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", d));
  }
  PjrtScope scope(api_);
  auto stats = PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  stats.device = devices_[d];
  if (absl::Status s = scope.ToStatus(api_->PJRT_Device_MemoryStats(&stats),
                                      "device memory stats");
      !s.ok()) {
    return absl::NotFoundError(s.message());
  }
  if (!stats.bytes_limit_is_set || stats.bytes_limit <= 0) {
    return absl::NotFoundError("the plugin gives no memory limit");
  }
  return stats.bytes_limit;
}

absl::StatusOr<std::unique_ptr<PjrtExecutable>> PjrtRuntime::Compile(
    absl::string_view module, absl::string_view compile_options) const {
  PjrtScope scope(api_);
  auto program = PJRT_ARGS(PJRT_Program);
  static const char kFormat[] = "mlir";
  program.code = const_cast<char*>(module.data());
  program.code_size = module.size();
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  auto args = PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = client_;
  args.program = &program;
  args.compile_options = compile_options.data();
  args.compile_options_size = compile_options.size();
  if (absl::Status s =
          scope.ToStatus(api_->PJRT_Client_Compile(&args), "XLA compile");
      !s.ok()) {
    return s;
  }
  return Describe(std::unique_ptr<PjrtExecutable>(
      new PjrtExecutable(this, args.executable)));
}

absl::StatusOr<std::string> PjrtRuntime::Serialize(
    const PjrtExecutable& exe) const {
  PjrtScope scope(api_);
  auto get = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe.exe_;
  if (absl::Status s = scope.ToStatus(
          api_->PJRT_LoadedExecutable_GetExecutable(&get), "executable");
      !s.ok()) {
    return s;
  }
  auto args = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  args.executable = get.executable;
  absl::Status status = scope.ToStatus(api_->PJRT_Executable_Serialize(&args),
                                       "serialize executable");
  std::string bytes;
  if (status.ok())
    bytes.assign(args.serialized_bytes, args.serialized_bytes_size);
  if (args.serialized_executable != nullptr &&
      args.serialized_executable_deleter != nullptr) {
    args.serialized_executable_deleter(args.serialized_executable);
  }
  auto destroy = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  destroy.executable = get.executable;
  scope.ToStatus(api_->PJRT_Executable_Destroy(&destroy), "").IgnoreError();
  if (!status.ok()) return status;
  return bytes;
}

absl::StatusOr<std::unique_ptr<PjrtExecutable>> PjrtRuntime::Deserialize(
    absl::string_view serialized, absl::string_view compile_options) const {
  PjrtScope scope(api_);
  auto args = PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  args.client = client_;
  args.serialized_executable = serialized.data();
  args.serialized_executable_size = serialized.size();
  args.overridden_serialized_compile_options = compile_options.data();
  args.overridden_serialized_compile_options_size = compile_options.size();
  if (absl::Status s =
          scope.ToStatus(api_->PJRT_Executable_DeserializeAndLoad(&args),
                         "deserialize executable");
      !s.ok()) {
    return s;
  }
  return Describe(std::unique_ptr<PjrtExecutable>(
      new PjrtExecutable(this, args.loaded_executable)));
}

absl::StatusOr<std::unique_ptr<PjrtExecutable>> PjrtRuntime::Describe(
    std::unique_ptr<PjrtExecutable> exe) const {
  PjrtScope scope(api_);
  auto devs = PJRT_ARGS(PJRT_LoadedExecutable_AddressableDevices_Args);
  devs.executable = exe->exe_;
  if (absl::Status s =
          scope.ToStatus(api_->PJRT_LoadedExecutable_AddressableDevices(&devs),
                         "executable devices");
      !s.ok()) {
    return s;
  }
  exe->devices_.assign(devs.addressable_devices,
                       devs.addressable_devices + devs.num_addressable_devices);
  for (size_t p = 0; p < exe->devices_.size(); ++p) {
    exe->device_indices_.push_back(DeviceIndex(*exe, p));
  }

  // Output element types and dimensions, checked against what the client
  // declared before any call runs.
  auto get = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe->exe_;
  if (absl::Status s = scope.ToStatus(
          api_->PJRT_LoadedExecutable_GetExecutable(&get), "executable");
      !s.ok()) {
    return s;
  }
  absl::Status status;
  auto types = PJRT_ARGS(PJRT_Executable_OutputElementTypes_Args);
  types.executable = get.executable;
  auto dims = PJRT_ARGS(PJRT_Executable_OutputDimensions_Args);
  dims.executable = get.executable;
  status = scope.ToStatus(api_->PJRT_Executable_OutputElementTypes(&types),
                          "output types");
  if (status.ok()) {
    status = scope.ToStatus(api_->PJRT_Executable_OutputDimensions(&dims),
                            "output dimensions");
  }
  if (status.ok()) {
    const int64_t* d = dims.dims;
    for (size_t o = 0; o < types.num_output_types && status.ok(); ++o) {
      auto dtype = FromBufferType(types.output_types[o]);
      if (!dtype.ok()) {
        status = absl::Status(
            dtype.status().code(),
            absl::StrCat("output ", o, ": ", dtype.status().message()));
        break;
      }
      TensorSpec spec{*dtype, Shape(d, d + dims.dim_sizes[o])};
      d += dims.dim_sizes[o];
      exe->outputs_.push_back(std::move(spec));
    }
  }
  auto stats = PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  stats.executable = get.executable;
  if (status.ok() &&
      scope.ToStatus(api_->PJRT_Executable_GetCompiledMemoryStats(&stats), "")
          .ok()) {
    // Device scratch; host scratch too on CPU, where they are one memory.
    exe->temp_bytes_ = stats.temp_size_in_bytes +
                       (platform_ == "cpu" ? stats.host_temp_size_in_bytes : 0);
  }
  auto destroy = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  destroy.executable = get.executable;
  scope.ToStatus(api_->PJRT_Executable_Destroy(&destroy), "").IgnoreError();
  if (!status.ok()) return status;
  return exe;
}

absl::StatusOr<bool> PjrtRuntime::ReadsInPlace(
    const builtin::ConstTensor& input, int device) const {
  if (device < 0 || device >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("no device ", device));
  }
  PjrtScope scope(api_);
  auto buffer = HostBuffer(api_, client_, platform_ == "cpu", scope, input,
                           devices_[device]);
  if (!buffer.ok()) return buffer.status();
  auto p = PJRT_ARGS(PJRT_Buffer_UnsafePointer_Args);
  p.buffer = *buffer;
  if (absl::Status s =
          scope.ToStatus(api_->PJRT_Buffer_UnsafePointer(&p), "pointer");
      !s.ok()) {
    return s;
  }
  return p.buffer_pointer == reinterpret_cast<uintptr_t>(input.data);
}

// One queued run: what it reads stays alive until it has completed.
struct PjrtRuntime::Run {
  const PjrtRuntime* runtime = nullptr;
  // The arguments' PJRT buffers made for this run (host memory in place,
  // device-to-device copies) and their zero-copy events.
  std::unique_ptr<PjrtScope> scope;
  // Host copies of device buffers no path here can read.
  std::vector<std::unique_ptr<char[]>> staged;
  std::vector<PJRT_Event*> complete;  // one per partition
  std::atomic<int> left{0};           // partitions not yet complete
  absl::Mutex mu;
  absl::Status status ABSL_GUARDED_BY(mu);
  DoneFn done;
  // The buffers that read `staged` go before it, also on an early return.
  ~Run() { scope.reset(); }
};

absl::StatusOr<PjrtRuntime::Outputs> PjrtRuntime::Execute(
    const PjrtExecutable& exe,
    const std::vector<std::vector<XlaArgument>>& inputs, absl::string_view what,
    DoneFn done) const {
  const size_t parts = exe.devices_.size();
  if (inputs.size() != parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the executable runs on ", parts, " devices, given ", inputs.size()));
  }
  const size_t num_args = parts == 0 ? 0 : inputs[0].size();
  const size_t num_outputs = exe.outputs_.size();
  auto run = std::make_unique<Run>();
  run->runtime = this;
  run->scope = std::make_unique<PjrtScope>(api_);
  PjrtScope& scope = *run->scope;
  std::vector<std::vector<PJRT_Buffer*>> args(parts);
  for (size_t p = 0; p < parts; ++p) {
    if (inputs[p].size() != num_args) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p, ": ", inputs[p].size(),
                       " inputs, partition 0 has ", num_args));
    }
    for (size_t i = 0; i < num_args; ++i) {
      absl::StatusOr<PJRT_Buffer*> buffer =
          Argument(scope, inputs[p][i], exe.devices_[p], &run->staged);
      if (!buffer.ok()) {
        return absl::Status(
            buffer.status().code(),
            absl::StrCat("argument ", i, ": ", buffer.status().message()));
      }
      args[p].push_back(*buffer);
    }
  }
  std::vector<PJRT_Buffer* const*> arg_lists(parts);
  std::vector<std::vector<PJRT_Buffer*>> outs(
      parts, std::vector<PJRT_Buffer*>(num_outputs, nullptr));
  std::vector<PJRT_Buffer**> out_lists(parts);
  for (size_t p = 0; p < parts; ++p) {
    arg_lists[p] = args[p].data();
    out_lists[p] = outs[p].data();
  }
  run->complete.assign(parts, nullptr);
  static std::atomic<int> launch_id{1};
  auto opts = PJRT_ARGS(PJRT_ExecuteOptions);
  opts.launch_id = launch_id.fetch_add(1);
  auto ex = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  ex.executable = exe.exe_;
  ex.options = &opts;
  ex.argument_lists = arg_lists.data();
  ex.num_devices = parts;
  ex.num_args = num_args;
  ex.output_lists = out_lists.data();
  ex.device_complete_events = run->complete.data();
  if (absl::Status s = scope.ToStatus(api_->PJRT_LoadedExecutable_Execute(&ex),
                                      "XLA execute");
      !s.ok()) {
    return s;
  }
  // Queued: from here `done` is called, once, whatever else happens. The
  // outputs are ours (freed with their PjrtBuffer), each ready once the run
  // that makes it has completed; one the plugin did not give is null, for
  // the caller to report.
  auto producer = std::make_shared<const std::string>(what);
  Outputs result(parts);
  for (size_t p = 0; p < parts; ++p) {
    for (size_t o = 0; o < num_outputs; ++o) {
      result[p].push_back(
          outs[p][o] == nullptr
              ? nullptr
              : std::shared_ptr<PjrtBuffer>(new PjrtBuffer(
                    handle_of_client_, outs[p][o], DeviceIndex(exe, p),
                    exe.outputs_[o].byte_size(), platform_ == "cpu",
                    producer)));
    }
  }
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
  bool completed = true;
  for (PJRT_Event* e : queued->complete) {
    auto ready = PJRT_ARGS(PJRT_Event_IsReady_Args);
    ready.event = e;
    if (e == nullptr) {
      completed = false;  // said below
    } else if (PJRT_Error* error = api_->PJRT_Event_IsReady(&ready)) {
      scope.ToStatus(error, "").IgnoreError();
      completed = false;
    } else {
      completed = ready.is_ready;
    }
    if (!completed) break;
  }
  if (completed) {
    for (PJRT_Event* e : queued->complete) {
      auto error = PJRT_ARGS(PJRT_Event_Error_Args);
      error.event = e;
      if (PJRT_Error* failed = api_->PJRT_Event_Error(&error)) {
        absl::Status s = scope.ToStatus(failed, "XLA execution");
        absl::MutexLock lock(&queued->mu);
        queued->status.Update(s);
      }
    }
    Finish(queued);
    return result;
  }
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
      if (!s.ok()) {
        absl::MutexLock lock(&queued->mu);
        queued->status.Update(s);
      }
      PartitionDone(nullptr, queued);
    });
  }
  return result;
}

void PjrtRuntime::PartitionDone(PJRT_Error* error, void* arg) {
  Run* run = static_cast<Run*>(arg);
  const PjrtRuntime* runtime = run->runtime;
  if (error != nullptr) {
    absl::Status s = PjrtScope(runtime->api_).ToStatus(error, "XLA execution");
    absl::MutexLock lock(&run->mu);
    run->status.Update(s);
  }
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

int PjrtRuntime::DeviceIndex(const PjrtExecutable& exe, size_t p) const {
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (devices_[d] == exe.devices_[p]) return static_cast<int>(d);
  }
  return -1;
}

absl::StatusOr<PJRT_Buffer*> PjrtRuntime::Argument(
    PjrtScope& scope, const XlaArgument& arg, PJRT_Device* device,
    std::vector<std::unique_ptr<char[]>>* staged) const {
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
      return mine->buffer_;  // as is
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

bool PjrtBuffer::BelongsTo(const PjrtRuntime& runtime) const {
  return client_ == runtime.handle_of_client_;
}

absl::Status PjrtBuffer::Await() const {
  absl::MutexLock lock(&mu_);
  if (awaited_) return ready_;
  const PJRT_Api* api = client_->api;
  PjrtScope scope(api);
  auto ready = PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer_;
  absl::Status s =
      scope.ToStatus(api->PJRT_Buffer_ReadyEvent(&ready), "output ready event");
  if (s.ok()) s = scope.Await(ready.event);
  if (!s.ok()) {
    ready_ =
        absl::Status(s.code(), absl::StrCat(*producer_, ": ", s.message()));
  } else if (host_memory_) {
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
