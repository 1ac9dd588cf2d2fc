#include "plexus/executors/cuda/cuda_api.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/executors/cuda/internal/dl.h"

#if __has_include(<cuda_runtime_api.h>) && __has_include(<cuda.h>)
// The toolkit is installed (CI, the development machines): check the
// declarations below against its headers.
#include <cuda.h>
#include <cuda_runtime_api.h>
#define PLEXUS_CUDA_HEADERS 1
#endif

namespace plexus::cuda {
namespace {

// The runtime's and driver's C ABI, as Plexus uses it.
using Error = int;  // cudaError_t, CUresult: 0 is success
constexpr Error kSuccess = 0;
constexpr int kMemcpyDeviceToDevice = 3;  // cudaMemcpyKind
constexpr unsigned kIpcLazyEnablePeerAccess = 1;
constexpr unsigned kStreamNonBlocking = 1;
struct IpcHandle {  // cudaIpcMemHandle_t
  char reserved[IpcRegion::kHandleBytes];
};
using DevicePtr = unsigned long long;  // CUdeviceptr on 64-bit hosts
constexpr Error kNotReady = 600;       // cudaErrorNotReady
struct DeviceUuidBytes {               // CUuuid
  unsigned char bytes[16];
};
// The virtual memory management API (cuMemCreate allocations).
using AllocationHandle = unsigned long long;  // CUmemGenericAllocationHandle
constexpr int kHandleTypePosixFd =
    1;                               // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kLocationDevice = 1;   // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kAccessReadWrite = 3;  // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
struct AccessDesc {                  // CUmemAccessDesc
  int location_type = kLocationDevice;  // CUmemLocation.type
  int location_id = 0;                  // CUmemLocation.id: a CUdevice
  int flags = kAccessReadWrite;
};
// CUpointer_attribute values.
constexpr int kAttrLegacyIpcCapable = 10;    // int
constexpr int kAttrAllowedHandleTypes = 14;  // uint64_t bitmask
constexpr int kAttrMempoolHandle = 17;       // CUmemoryPool (a pointer)
constexpr int kAttrMappingSize = 18;         // size_t
constexpr int kAttrMappingBaseAddr = 19;     // void*

#ifdef PLEXUS_CUDA_HEADERS
static_assert(sizeof(IpcHandle) == sizeof(cudaIpcMemHandle_t));
static_assert(kMemcpyDeviceToDevice == cudaMemcpyDeviceToDevice);
static_assert(kIpcLazyEnablePeerAccess == cudaIpcMemLazyEnablePeerAccess);
static_assert(kStreamNonBlocking == cudaStreamNonBlocking);
static_assert(kSuccess == cudaSuccess && kSuccess == CUDA_SUCCESS);
static_assert(sizeof(DevicePtr) == sizeof(CUdeviceptr));
static_assert(sizeof(Stream) == sizeof(cudaStream_t));
static_assert(kNotReady == cudaErrorNotReady);
static_assert(sizeof(DeviceUuidBytes) == sizeof(CUuuid));
static_assert(sizeof(int) == sizeof(CUdevice));
static_assert(sizeof(AllocationHandle) == sizeof(CUmemGenericAllocationHandle));
static_assert(kHandleTypePosixFd == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
static_assert(kLocationDevice == CU_MEM_LOCATION_TYPE_DEVICE);
static_assert(kAccessReadWrite == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
static_assert(sizeof(AccessDesc) == sizeof(CUmemAccessDesc));
static_assert(offsetof(AccessDesc, location_type) ==
                  offsetof(CUmemAccessDesc, location) +
                      offsetof(CUmemLocation, type) &&
              offsetof(AccessDesc, location_id) ==
                  offsetof(CUmemAccessDesc, location) +
                      offsetof(CUmemLocation, id) &&
              offsetof(AccessDesc, flags) == offsetof(CUmemAccessDesc, flags));
static_assert(sizeof(CUmemLocationType) == sizeof(int) &&
              sizeof(CUmemAccess_flags) == sizeof(int) &&
              sizeof(CUmemAllocationHandleType) == sizeof(int));
static_assert(kAttrLegacyIpcCapable ==
                  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE &&
              kAttrAllowedHandleTypes ==
                  CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES &&
              kAttrMempoolHandle == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE &&
              kAttrMappingSize == CU_POINTER_ATTRIBUTE_MAPPING_SIZE &&
              kAttrMappingBaseAddr == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR);
#endif

}  // namespace

struct CudaApi::Table {
  const char* (*GetErrorString)(Error);
  Error (*GetDeviceCount)(int*);
  Error (*SetDevice)(int);
  Error (*Free)(void*);
  Error (*IpcGetMemHandle)(IpcHandle*, void*);
  Error (*IpcOpenMemHandle)(void**, IpcHandle, unsigned);
  Error (*IpcCloseMemHandle)(void*);
  Error (*MemcpyAsync)(void*, const void*, size_t, int, Stream);
  Error (*StreamCreateWithFlags)(Stream*, unsigned);
  Error (*StreamSynchronize)(Stream);
  Error (*StreamDestroy)(Stream);
  Error (*StreamQuery)(Stream);
  // Driver.
  Error (*MemGetAddressRange)(DevicePtr*, size_t*, DevicePtr);
  Error (*DriverGetErrorString)(Error, const char**);
  Error (*DeviceGet)(int*, int);                        // cuDeviceGet
  Error (*DeviceGetUuid)(DeviceUuidBytes*, int);        // cuDeviceGetUuid_v2
  Error (*PointerGetAttribute)(void*, int, DevicePtr);  // cuPointerGetAttribute
  // Driver, virtual memory management.
  Error (*MemRetainAllocationHandle)(AllocationHandle*, void*);
  Error (*MemExportToShareableHandle)(void*, AllocationHandle, int,
                                      unsigned long long);
  Error (*MemImportFromShareableHandle)(AllocationHandle*, void*, int);
  Error (*MemAddressReserve)(DevicePtr*, size_t, size_t, DevicePtr,
                             unsigned long long);
  Error (*MemAddressFree)(DevicePtr, size_t);
  Error (*MemMap)(DevicePtr, size_t, size_t, AllocationHandle,
                  unsigned long long);
  Error (*MemUnmap)(DevicePtr, size_t);
  Error (*MemSetAccess)(DevicePtr, size_t, const AccessDesc*, size_t);
  Error (*MemRelease)(AllocationHandle);
};

namespace {

using internal::Bind;
using internal::OpenFirst;

absl::StatusOr<const CudaApi*> LoadOnce(const std::vector<std::string>& dirs,
                                        CudaApi::Table* t, std::string* rt,
                                        std::string* drv) {
  std::vector<std::string> tried;
  void* runtime = OpenFirst(
      {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}, dirs, rt, &tried);
  void* driver = OpenFirst({"libcuda.so.1"}, dirs, drv, &tried);
  if (runtime == nullptr || driver == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("CUDA is not available: could not open ",
                     runtime == nullptr ? "the CUDA runtime" : "the driver",
                     " (tried ", absl::StrJoin(tried, ", "), ")"));
  }
  for (absl::Status s : {
           Bind(runtime, "CUDA", "cudaGetErrorString", &t->GetErrorString),
           Bind(runtime, "CUDA", "cudaGetDeviceCount", &t->GetDeviceCount),
           Bind(runtime, "CUDA", "cudaSetDevice", &t->SetDevice),
           Bind(runtime, "CUDA", "cudaFree", &t->Free),
           Bind(runtime, "CUDA", "cudaIpcGetMemHandle", &t->IpcGetMemHandle),
           Bind(runtime, "CUDA", "cudaIpcOpenMemHandle", &t->IpcOpenMemHandle),
           Bind(runtime, "CUDA", "cudaIpcCloseMemHandle",
                &t->IpcCloseMemHandle),
           Bind(runtime, "CUDA", "cudaMemcpyAsync", &t->MemcpyAsync),
           Bind(runtime, "CUDA", "cudaStreamCreateWithFlags",
                &t->StreamCreateWithFlags),
           Bind(runtime, "CUDA", "cudaStreamSynchronize",
                &t->StreamSynchronize),
           Bind(runtime, "CUDA", "cudaStreamDestroy", &t->StreamDestroy),
           Bind(runtime, "CUDA", "cudaStreamQuery", &t->StreamQuery),
           Bind(driver, "CUDA", "cuMemGetAddressRange_v2",
                &t->MemGetAddressRange),
           Bind(driver, "CUDA", "cuGetErrorString", &t->DriverGetErrorString),
           Bind(driver, "CUDA", "cuDeviceGet", &t->DeviceGet),
           Bind(driver, "CUDA", "cuDeviceGetUuid_v2", &t->DeviceGetUuid),
           Bind(driver, "CUDA", "cuPointerGetAttribute",
                &t->PointerGetAttribute),
           Bind(driver, "CUDA", "cuMemRetainAllocationHandle",
                &t->MemRetainAllocationHandle),
           Bind(driver, "CUDA", "cuMemExportToShareableHandle",
                &t->MemExportToShareableHandle),
           Bind(driver, "CUDA", "cuMemImportFromShareableHandle",
                &t->MemImportFromShareableHandle),
           Bind(driver, "CUDA", "cuMemAddressReserve", &t->MemAddressReserve),
           Bind(driver, "CUDA", "cuMemAddressFree", &t->MemAddressFree),
           Bind(driver, "CUDA", "cuMemMap", &t->MemMap),
           Bind(driver, "CUDA", "cuMemUnmap", &t->MemUnmap),
           Bind(driver, "CUDA", "cuMemSetAccess", &t->MemSetAccess),
           Bind(driver, "CUDA", "cuMemRelease", &t->MemRelease),
       }) {
    if (!s.ok()) return s;
  }
  return nullptr;  // the caller fills in the CudaApi
}

}  // namespace

absl::StatusOr<const CudaApi*> CudaApi::Load(
    const std::vector<std::string>& search_dirs) {
  static std::once_flag once;
  static absl::StatusOr<const CudaApi*>* result;
  std::call_once(once, [&] {
    auto* table = new Table{};
    auto* api = new CudaApi();
    absl::StatusOr<const CudaApi*> loaded =
        LoadOnce(search_dirs, table, &api->runtime_path_, &api->driver_path_);
    if (loaded.ok()) {
      api->table_ = table;
      result = new absl::StatusOr<const CudaApi*>(api);
    } else {
      result = new absl::StatusOr<const CudaApi*>(loaded.status());
      delete api;
      delete table;
    }
  });
  return *result;
}

std::vector<std::string> CudaApi::LibraryDirsBeside(
    const std::string& plugin_path) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  std::error_code ec;
  // .../site-packages/jax_plugins/xla_cuda13/<plugin>.so (or one level
  // less deep) → .../site-packages/nvidia: the nearest one up.
  fs::path nvidia;
  fs::path up = fs::path(plugin_path).parent_path();
  for (int level = 0; level < 3 && !up.empty();
       ++level, up = up.parent_path()) {
    if (fs::is_directory(up / "nvidia", ec)) {
      nvidia = up / "nvidia";
      break;
    }
  }
  if (nvidia.empty()) return dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(nvidia, ec)) {
    for (const fs::path& lib : {e.path() / "lib", e.path() / "lib64"}) {
      if (fs::is_directory(lib, ec)) dirs.push_back(lib.string());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

namespace {
absl::Status Check(const CudaApi::Table& t, Error e, const char* call) {
  if (e == kSuccess) return absl::OkStatus();
  const char* message = t.GetErrorString(e);
  return absl::UnavailableError(absl::StrCat(
      call, " failed: ", message != nullptr ? message : "unknown error",
      " (CUDA error ", e, ")"));
}
absl::Status CheckDriver(const CudaApi::Table& t, Error e, const char* call) {
  if (e == kSuccess) return absl::OkStatus();
  const char* message = nullptr;
  t.DriverGetErrorString(e, &message);
  return absl::UnavailableError(absl::StrCat(
      call, " failed: ", message != nullptr ? message : "unknown error",
      " (CUDA driver error ", e, ")"));
}
}  // namespace

absl::Status CudaApi::Use(int ordinal) const {
  // cudaSetDevice makes the device's primary context current on this
  // thread (CUDA 12 and later), which the driver calls need.
  return Check(*table_, table_->SetDevice(ordinal), "cudaSetDevice");
}

absl::StatusOr<int> CudaApi::DeviceCount() const {
  int n = 0;
  absl::Status s =
      Check(*table_, table_->GetDeviceCount(&n), "cudaGetDeviceCount");
  if (!s.ok()) return s;
  return n;
}

absl::StatusOr<IpcRegion> CudaApi::ExportRegion(int ordinal,
                                                const void* ptr) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  DevicePtr base = 0;
  size_t size = 0;
  auto address = reinterpret_cast<DevicePtr>(ptr);
  if (absl::Status s = CheckDriver(
          *table_, table_->MemGetAddressRange(&base, &size, address),
          "cuMemGetAddressRange");
      !s.ok()) {
    return s;
  }
  // Legacy CUDA IPC exports cudaMalloc-style allocations only; a virtual
  // memory mapping created to allow it goes as a POSIX fd; say why not for
  // the others (the plugin's allocator decides how it allocates).
  int legacy_ipc = 1;
  if (table_->PointerGetAttribute(&legacy_ipc, kAttrLegacyIpcCapable, base) ==
          kSuccess &&
      legacy_ipc == 0) {
    uint64_t handle_types = 0;
    void* pool = nullptr;
    (void)table_->PointerGetAttribute(&handle_types, kAttrAllowedHandleTypes,
                                      base);
    (void)table_->PointerGetAttribute(&pool, kAttrMempoolHandle, base);
    if (pool == nullptr && (handle_types & kHandleTypePosixFd) != 0) {
      return ExportFd(address);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the plugin allocated this memory in a way CUDA IPC cannot export: ",
        pool != nullptr ? "from a stream-ordered memory pool (cudaMallocAsync)"
                        : "a virtual memory mapping (cuMemCreate) that allows "
                          "no POSIX file descriptor export",
        "; shareable handle types allowed: 0x", absl::Hex(handle_types)));
  }
  IpcHandle handle;
  if (absl::Status s =
          Check(*table_,
                table_->IpcGetMemHandle(&handle, reinterpret_cast<void*>(base)),
                "cudaIpcGetMemHandle");
      !s.ok()) {
    return s;
  }
  IpcRegion region;
  std::memcpy(region.handle.data(), handle.reserved, sizeof(handle.reserved));
  region.offset = address - base;
  return region;
}

absl::StatusOr<IpcRegion> CudaApi::ExportFd(DevicePtr address) const {
  void* mapping_base = nullptr;
  size_t mapping_size = 0;
  if (absl::Status s =
          CheckDriver(*table_,
                      table_->PointerGetAttribute(
                          &mapping_base, kAttrMappingBaseAddr, address),
                      "cuPointerGetAttribute (MAPPING_BASE_ADDR)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDriver(
          *table_,
          table_->PointerGetAttribute(&mapping_size, kAttrMappingSize, address),
          "cuPointerGetAttribute (MAPPING_SIZE)");
      !s.ok()) {
    return s;
  }
  const auto base = reinterpret_cast<DevicePtr>(mapping_base);
  if (address < base || address - base >= mapping_size) {
    return absl::InternalError(
        absl::StrCat("CUDA says address 0x", absl::Hex(address),
                     " lies in the mapping at 0x", absl::Hex(base), " of ",
                     mapping_size, " bytes, which does not hold it"));
  }
  AllocationHandle allocation = 0;
  if (absl::Status s = CheckDriver(
          *table_, table_->MemRetainAllocationHandle(&allocation, mapping_base),
          "cuMemRetainAllocationHandle");
      !s.ok()) {
    return s;
  }
  int fd = -1;
  absl::Status exported =
      CheckDriver(*table_,
                  table_->MemExportToShareableHandle(&fd, allocation,
                                                     kHandleTypePosixFd, 0),
                  "cuMemExportToShareableHandle (POSIX file descriptor)");
  // The fd holds the allocation from here on; the retained handle goes.
  absl::Status released =
      CheckDriver(*table_, table_->MemRelease(allocation), "cuMemRelease");
  if (!exported.ok() || !released.ok()) {
    if (exported.ok() && fd >= 0) close(fd);
    return exported.ok() ? released : exported;
  }
  IpcRegion region;
  region.kind = IpcRegion::Kind::kPosixFd;
  region.fd = fd;
  region.mapping_size = mapping_size;
  region.offset = address - base;
  return region;
}

absl::StatusOr<CudaApi::Opened> CudaApi::OpenRegion(
    int ordinal, const IpcRegion& region) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  if (region.kind == IpcRegion::Kind::kPosixFd) {
    return OpenFd(ordinal, region);
  }
  IpcHandle handle;
  std::memcpy(handle.reserved, region.handle.data(), sizeof(handle.reserved));
  void* base = nullptr;
  if (absl::Status s = Check(
          *table_,
          table_->IpcOpenMemHandle(&base, handle, kIpcLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle");
      !s.ok()) {
    return s;
  }
  // The mapped region's size, so a reader can check what it was told (0
  // where the driver does not say it of a mapping).
  DevicePtr mapped = 0;
  size_t size = 0;
  if (table_->MemGetAddressRange(
          &mapped, &size, reinterpret_cast<DevicePtr>(base)) != kSuccess) {
    size = 0;
  }
  Opened opened;
  opened.base = base;
  opened.value = static_cast<char*>(base) + region.offset;
  opened.size = size;
  return opened;
}

absl::StatusOr<CudaApi::Opened> CudaApi::OpenFd(int ordinal,
                                                const IpcRegion& region) const {
  if (region.fd < 0 || region.mapping_size == 0) {
    return absl::InvalidArgumentError(
        "CUDA IPC: a POSIX fd export without its fd or mapping size");
  }
  const size_t size = region.mapping_size;
  int device = 0;
  if (absl::Status s = CheckDriver(*table_, table_->DeviceGet(&device, ordinal),
                                   "cuDeviceGet");
      !s.ok()) {
    return s;
  }
  AllocationHandle allocation = 0;
  if (absl::Status s = CheckDriver(
          *table_,
          table_->MemImportFromShareableHandle(
              &allocation,
              reinterpret_cast<void*>(static_cast<intptr_t>(region.fd)),
              kHandleTypePosixFd),
          "cuMemImportFromShareableHandle (POSIX file descriptor)");
      !s.ok()) {
    return s;
  }
  // Each step taken is undone, in reverse, if a later one fails.
  DevicePtr va = 0;
  bool mapped = false;
  absl::Status s =
      CheckDriver(*table_, table_->MemAddressReserve(&va, size, 0, 0, 0),
                  "cuMemAddressReserve");
  if (s.ok()) {
    s = CheckDriver(*table_, table_->MemMap(va, size, 0, allocation, 0),
                    "cuMemMap");
    mapped = s.ok();
  }
  if (s.ok()) {
    AccessDesc access;
    access.location_id = device;
    s = CheckDriver(*table_, table_->MemSetAccess(va, size, &access, 1),
                    "cuMemSetAccess");
  }
  if (!s.ok()) {
    if (mapped) (void)table_->MemUnmap(va, size);
    if (va != 0) (void)table_->MemAddressFree(va, size);
    (void)table_->MemRelease(allocation);
    return s;
  }
  Opened opened;
  opened.kind = IpcRegion::Kind::kPosixFd;
  opened.base = reinterpret_cast<void*>(va);
  opened.value = static_cast<char*>(opened.base) + region.offset;
  opened.size = size;
  opened.allocation = allocation;
  return opened;
}

absl::Status CudaApi::CloseRegion(int ordinal, const Opened& opened) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  if (opened.kind == IpcRegion::Kind::kLegacyHandle) {
    return Check(*table_, table_->IpcCloseMemHandle(opened.base),
                 "cudaIpcCloseMemHandle");
  }
  const auto va = reinterpret_cast<DevicePtr>(opened.base);
  absl::Status s =
      CheckDriver(*table_, table_->MemUnmap(va, opened.size), "cuMemUnmap");
  s.Update(CheckDriver(*table_, table_->MemAddressFree(va, opened.size),
                       "cuMemAddressFree"));
  s.Update(CheckDriver(*table_, table_->MemRelease(opened.allocation),
                       "cuMemRelease"));
  return s;
}

absl::Status CudaApi::CopyDeviceToDevice(int ordinal, void* dst,
                                         const void* src, size_t bytes) const {
  // cudaMemcpy does not wait for a device-to-device copy, and would order
  // it behind the legacy default stream: a stream of its own, waited for.
  absl::StatusOr<Stream> stream = CreateStream(ordinal);
  if (!stream.ok()) return stream.status();
  absl::Status s = Check(
      *table_,
      table_->MemcpyAsync(dst, src, bytes, kMemcpyDeviceToDevice, *stream),
      "cudaMemcpyAsync (device to device)");
  if (s.ok()) s = Synchronize(ordinal, *stream);
  s.Update(DestroyStream(ordinal, *stream));
  return s;
}

absl::StatusOr<Stream> CudaApi::CreateStream(int ordinal) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  Stream stream = nullptr;
  if (absl::Status s = Check(
          *table_, table_->StreamCreateWithFlags(&stream, kStreamNonBlocking),
          "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  return stream;
}

absl::Status CudaApi::Synchronize(int ordinal, Stream stream) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  return Check(*table_, table_->StreamSynchronize(stream),
               "cudaStreamSynchronize");
}

absl::Status CudaApi::DestroyStream(int ordinal, Stream stream) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  return Check(*table_, table_->StreamDestroy(stream), "cudaStreamDestroy");
}

absl::StatusOr<bool> CudaApi::StreamDone(int ordinal, Stream stream) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  const Error e = table_->StreamQuery(stream);
  if (e == kNotReady) return false;
  if (absl::Status s = Check(*table_, e, "cudaStreamQuery"); !s.ok()) return s;
  return true;
}

absl::StatusOr<std::string> CudaApi::DeviceUuid(int ordinal) const {
  if (absl::Status s = Use(ordinal); !s.ok()) return s;
  int device = 0;
  if (absl::Status s = CheckDriver(*table_, table_->DeviceGet(&device, ordinal),
                                   "cuDeviceGet");
      !s.ok()) {
    return s;
  }
  DeviceUuidBytes uuid;
  if (absl::Status s = CheckDriver(
          *table_, table_->DeviceGetUuid(&uuid, device), "cuDeviceGetUuid");
      !s.ok()) {
    return s;
  }
  std::string hex;
  for (unsigned char b : uuid.bytes) {
    absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  }
  return hex;
}

}  // namespace plexus::cuda
