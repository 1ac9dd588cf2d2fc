#include "plexus/executors/xla/internal/pjrt_support.h"

#include <dlfcn.h>
#include <pthread.h>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace plexus::xla {

ScopedThreadName::ScopedThreadName(const char* name) {
  restore_ = pthread_getname_np(pthread_self(), saved_, sizeof(saved_)) == 0;
  if (restore_) restore_ = pthread_setname_np(pthread_self(), name) == 0;
}

ScopedThreadName::~ScopedThreadName() {
  if (restore_) pthread_setname_np(pthread_self(), saved_);
}

absl::StatusOr<const PJRT_Api*> OpenPlugin(const std::string& path) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* opened =
      new absl::flat_hash_map<std::string, absl::StatusOr<const PJRT_Api*>>();
  absl::MutexLock lock(&mu);
  auto it = opened->find(path);
  if (it != opened->end()) return it->second;
  auto open = [&]() -> absl::StatusOr<const PJRT_Api*> {
    // Threads its static initialisers or Initialize start are its own.
    ScopedThreadName plugin_threads(kPluginThreadName);
    // RTLD_LOCAL: the plugin keeps its own protobuf, abseil and LLVM.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::NotFoundError(absl::StrCat("cannot load: ", dlerror()));
    }
    using GetApiFn = const PJRT_Api* (*)();
    auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
    if (get_api == nullptr) {
      return absl::InvalidArgumentError("not a PJRT plugin: no GetPjrtApi");
    }
    const PJRT_Api* api = get_api();
    if (api == nullptr) return absl::InternalError("GetPjrtApi returned null");
    const auto& v = api->pjrt_api_version;
    if (v.major_version != PJRT_API_MAJOR) {
      return absl::FailedPreconditionError(
          absl::StrCat("PJRT C API ", v.major_version, ".", v.minor_version,
                       " is incompatible with the ", PJRT_API_MAJOR, ".",
                       PJRT_API_MINOR, " Plexus was built against"));
    }
    PjrtScope scope(api);
    auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
    if (absl::Status s =
            scope.ToStatus(api->PJRT_Plugin_Initialize(&init), "initialise");
        !s.ok()) {
      return s;
    }
    return api;
  };
  return opened->emplace(path, open()).first->second;
}
namespace {

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

}  // namespace

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

}  // namespace plexus::xla
