#include "plexus/executors/xla/pjrt_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>

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

// Owns PJRT objects created during one call and destroys them in order.
class Scope {
 public:
  explicit Scope(const PJRT_Api* api) : api_(api) {}
  ~Scope() {
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

// A PJRT buffer on `device` over `input`'s host memory, owned by `scope`.
// Store buffers are immutable while a task reads them: a plugin whose
// devices address host memory (CPU) uses them in place until it signals
// done_with_host_buffer; others copy them to the device, from the same
// memory, before signalling.
absl::StatusOr<PJRT_Buffer*> HostBuffer(const PJRT_Api* api,
                                        PJRT_Client* client, bool host_memory,
                                        Scope& scope,
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

PjrtExecutable::~PjrtExecutable() {
  auto a = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = exe_;
  Scope(runtime_->api_)
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
  Scope scope(api_);
  auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  if (absl::Status s =
          scope.ToStatus(api_->PJRT_Plugin_Initialize(&init), "initialise");
      !s.ok()) {
    return s;
  }
  PJRT_NamedValue count;
  std::memset(&count, 0, sizeof(count));
  count.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  static const char kCount[] = "cpu_device_count";
  count.name = kCount;
  count.name_size = sizeof(kCount) - 1;
  count.type = PJRT_NamedValue_kInt64;
  count.int64_value = options.cpu_device_count;
  count.value_size = 1;
  auto create = PJRT_ARGS(PJRT_Client_Create_Args);
  create.create_options = &count;
  create.num_options = 1;
  PJRT_Error* error = api_->PJRT_Client_Create(&create);
  if (error != nullptr) {
    // Plugins that do not know the option (GPU) reject it: retry bare.
    scope.ToStatus(error, "").IgnoreError();
    create = PJRT_ARGS(PJRT_Client_Create_Args);
    if (absl::Status s =
            scope.ToStatus(api_->PJRT_Client_Create(&create), "create client");
        !s.ok()) {
      return s;
    }
  }
  client_ = create.client;
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
  return absl::OkStatus();
}

PjrtRuntime::~PjrtRuntime() {
  if (client_ != nullptr) {
    auto a = PJRT_ARGS(PJRT_Client_Destroy_Args);
    a.client = client_;
    Scope(api_).ToStatus(api_->PJRT_Client_Destroy(&a), "").IgnoreError();
  }
  // The plugin stays mapped: its static destructors and threads may still
  // run at exit, and unloading XLA is not supported.
}

std::string PjrtRuntime::api_version() const {
  return absl::StrCat(api_->pjrt_api_version.major_version, ".",
                      api_->pjrt_api_version.minor_version);
}

absl::StatusOr<std::unique_ptr<PjrtExecutable>> PjrtRuntime::Compile(
    absl::string_view module, absl::string_view compile_options) const {
  Scope scope(api_);
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
  std::unique_ptr<PjrtExecutable> exe(
      new PjrtExecutable(this, args.executable));

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
  Scope scope(api_);
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

absl::Status PjrtRuntime::Execute(
    const PjrtExecutable& exe,
    const std::vector<std::vector<builtin::ConstTensor>>& inputs,
    const std::vector<std::vector<builtin::MutableTensor>>& outputs) const {
  const size_t parts = exe.devices_.size();
  if (inputs.size() != parts || outputs.size() != parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the executable runs on ", parts, " devices, given ", inputs.size()));
  }
  const size_t num_args = parts == 0 ? 0 : inputs[0].size();
  const size_t num_outputs = exe.outputs_.size();
  Scope scope(api_);
  std::vector<std::vector<PJRT_Buffer*>> args(parts);
  for (size_t p = 0; p < parts; ++p) {
    if (inputs[p].size() != num_args || outputs[p].size() != num_outputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p, ": ", inputs[p].size(), " inputs and ",
                       outputs[p].size(), " outputs, the executable has ",
                       num_outputs, " outputs"));
    }
    for (size_t i = 0; i < num_args; ++i) {
      auto buffer = HostBuffer(api_, client_, platform_ == "cpu", scope,
                               inputs[p][i], exe.devices_[p]);
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
  if (absl::Status s = scope.ToStatus(api_->PJRT_LoadedExecutable_Execute(&ex),
                                      "XLA execute");
      !s.ok()) {
    return s;
  }
  for (auto& list : outs) {
    for (PJRT_Buffer* b : list) {
      if (b != nullptr) scope.Own(b);
    }
  }
  // Start every device-to-host copy, then wait for them all.
  std::vector<PJRT_Event*> copies;
  absl::Status status;
  for (size_t p = 0; p < parts && status.ok(); ++p) {
    for (size_t o = 0; o < num_outputs; ++o) {
      const builtin::MutableTensor& dst = outputs[p][o];
      if (dst.data == nullptr) continue;
      if (dst.spec.byte_size() != exe.outputs_[o].byte_size()) {
        status = absl::InternalError(
            absl::StrCat("output ", o, " is ", exe.outputs_[o].ToString(),
                         " but the program declared ", dst.spec.ToString()));
        break;
      }
      auto t = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
      t.src = outs[p][o];
      t.dst = dst.data;
      t.dst_size = dst.spec.byte_size();
      status = scope.ToStatus(api_->PJRT_Buffer_ToHostBuffer(&t),
                              absl::StrCat("output ", o, " to host"));
      if (!status.ok()) break;
      copies.push_back(t.event);
    }
  }
  for (PJRT_Event* e : copies) {
    absl::Status s = scope.Await(e);
    if (status.ok()) status = s;
  }
  return status;
}

}  // namespace plexus::xla
