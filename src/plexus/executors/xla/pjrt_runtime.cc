#include "plexus/executors/xla/pjrt_runtime.h"

#include <dlfcn.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/executors/xla/internal/pjrt_support.h"
#include "plexus/executors/xla/lapack/lapack_handlers.h"

namespace plexus::xla {

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

namespace {

// The plugin's `stablehlo_current_version` attribute ("1.13.3"), or empty.
std::string ReadStableHloVersion(const PJRT_Api* api) {
  auto attrs = PJRT_ARGS(PJRT_Plugin_Attributes_Args);
  if (PjrtScope(api)
          .ToStatus(api->PJRT_Plugin_Attributes(&attrs), "attributes")
          .ok()) {
    for (size_t i = 0; i < attrs.num_attributes; ++i) {
      const PJRT_NamedValue& a = attrs.attributes[i];
      if (absl::string_view(a.name, a.name_size) !=
              "stablehlo_current_version" ||
          a.type != PJRT_NamedValue_kInt64List) {
        continue;
      }
      std::string version;
      for (size_t k = 0; k < a.value_size; ++k) {
        absl::StrAppend(&version, k == 0 ? "" : ".", a.int64_array_value[k]);
      }
      return version;
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> PjrtRuntime::PluginStableHloVersion(
    const std::string& path) {
  absl::StatusOr<const PJRT_Api*> api = OpenPlugin(path);
  if (!api.ok()) {
    return absl::Status(
        api.status().code(),
        absl::StrCat("PJRT plugin '", path, "': ", api.status().message()));
  }
  return ReadStableHloVersion(*api);
}

absl::Status PjrtRuntime::Init(const PjrtOptions& options) {
  plugin_path_ = options.plugin_path;
  if (plugin_path_.empty()) {
    return absl::FailedPreconditionError(
        "no plugin configured (plexus-worker --pjrt-plugin or "
        "PLEXUS_PJRT_PLUGIN); scripts/setup.sh installs xla-cpu-pjrt");
  }
  absl::StatusOr<const PJRT_Api*> api = OpenPlugin(plugin_path_);
  if (!api.ok()) return api.status();
  api_ = *api;
  PjrtScope scope(api_);
  stablehlo_version_ = ReadStableHloVersion(api_);
  if (absl::Status s = CreateClient(options); !s.ok()) return s;
  handle_of_client_ = std::make_shared<PjrtClientHandle>(api_, client_);
  auto name = PJRT_ARGS(PJRT_Client_PlatformName_Args);
  name.client = client_;
  if (absl::Status s = scope.ToStatus(api_->PJRT_Client_PlatformName(&name),
                                      "platform name");
      !s.ok()) {
    return s;
  }
  platform_.assign(name.platform_name, name.platform_name_size);
  if (platform_ == "cpu") {
    // jnp.linalg on CPU lowers to jaxlib's LAPACK custom calls, for which
    // the CPU plugin has no handlers: ours, before anything compiles.
    lapack_handlers_ = lapack::RegisterLapackHandlers(api_);
  }
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

absl::Status PjrtRuntime::CreateClient(const PjrtOptions& options) {
  PjrtScope scope(api_);
  // The client starts the plugin's pools for runs: threads of its own
  // (kPluginThreadName), not of whichever worker thread loads it.
  ScopedThreadName plugin_threads(kPluginThreadName);
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
  // XLA's compiler starts pools of its own on the first compile.
  ScopedThreadName compiler_threads(kCompilerThreadName);
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
  ScopedThreadName compiler_threads(kCompilerThreadName);
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

int PjrtRuntime::DeviceIndex(const PjrtExecutable& exe, size_t p) const {
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (devices_[d] == exe.devices_[p]) return static_cast<int>(d);
  }
  return -1;
}

}  // namespace plexus::xla
