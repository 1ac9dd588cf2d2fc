#include "plexus/worker/cuda_ipc.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"

namespace plexus {

absl::Status IpcPossible(const Storage& data, bool shares_memory,
                         bool peer_opens_cuda_ipc, const absl::Status& here) {
  auto no = [](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA IPC: ", why));
  };
  if (data.kind() != MemoryKind::kDevice) {
    return no("the value is in host memory");
  }
  if (!shares_memory) {
    return no(
        "the receiving worker is not reached over this host's unix socket "
        "(another host, another network namespace, or --no-shm)");
  }
  if (!here.ok()) return no(here.message());
  if (!peer_opens_cuda_ipc) {
    return no(
        "the receiving worker does not open CUDA IPC (no CUDA GPU there, "
        "or --no-cuda-ipc)");
  }
  if (!data.device_buffer()->in_gpu_memory()) {
    return no("the value is not in a CUDA GPU's memory");
  }
  return absl::OkStatus();
}

std::unique_ptr<CudaIpc> CudaIpc::Create(bool wanted,
                                         const std::string& platform,
                                         const std::string& plugin_path) {
  if (!wanted) {
    return Off(absl::FailedPreconditionError("turned off (--no-cuda-ipc)"));
  }
  if (platform != "cuda") {
    return Off(absl::FailedPreconditionError(absl::StrCat(
        "the PJRT plugin's platform is '", platform, "', not CUDA")));
  }
  absl::StatusOr<const cuda::CudaApi*> api =
      cuda::CudaApi::Load(cuda::CudaApi::LibraryDirsBeside(plugin_path));
  if (!api.ok()) return Off(api.status());
  absl::StatusOr<int> gpus = (*api)->DeviceCount();
  if (!gpus.ok()) return Off(gpus.status());
  if (*gpus == 0) {
    return Off(absl::FailedPreconditionError("the CUDA runtime sees no GPU"));
  }
  return std::unique_ptr<CudaIpc>(new CudaIpc(*api, absl::OkStatus()));
}

std::unique_ptr<CudaIpc> CudaIpc::Off(absl::Status why) {
  if (why.ok()) why = absl::FailedPreconditionError("off");
  return std::unique_ptr<CudaIpc>(new CudaIpc(nullptr, std::move(why)));
}

absl::StatusOr<transport::IpcShard> CudaIpc::Export(
    const DeviceBuffer& buffer) const {
  if (!available_.ok()) return available_;
  absl::StatusOr<GpuAddress> where = buffer.gpu_address();
  if (!where.ok()) return where.status();
  absl::StatusOr<cuda::IpcRegion> region =
      api_->ExportRegion(where->ordinal, where->address);
  if (!region.ok()) return region.status();
  transport::IpcShard shard;
  static_assert(sizeof(shard.handle) == sizeof(region->handle));
  if (region->kind == cuda::IpcRegion::Kind::kPosixFd) {
    shard.kind = transport::IpcShard::Kind::kPosixFd;
    shard.fd = transport::SharedFd(region->fd);  // owns it from here on
    shard.mapping_size = region->mapping_size;
  } else {
    std::memcpy(shard.handle.data(), region->handle.data(),
                shard.handle.size());
  }
  shard.offset = region->offset;
  shard.bytes = buffer.size();
  shard.ordinal = where->ordinal;
  return shard;
}

absl::StatusOr<cuda::CudaApi::Opened> CudaIpc::Map(
    const transport::IpcShard& shard, int ordinal, std::string* key) const {
  if (shard.kind == transport::IpcShard::Kind::kPosixFd) {
    // Imported and mapped per copy: the descriptor differs every time.
    key->clear();
    cuda::IpcRegion region;
    region.kind = cuda::IpcRegion::Kind::kPosixFd;
    region.fd = shard.fd.get();  // still the shard's: closed with it
    region.mapping_size = shard.mapping_size;
    return api_->OpenRegion(ordinal, region);
  }
  *key =
      absl::StrCat(absl::string_view(shard.handle.data(), shard.handle.size()),
                   "@", ordinal);
  absl::MutexLock lock(&mu_);
  auto it = mappings_.find(*key);
  if (it != mappings_.end()) {
    it->second.users++;
    return it->second.opened;
  }
  cuda::IpcRegion region;
  std::memcpy(region.handle.data(), shard.handle.data(), region.handle.size());
  region.offset = 0;  // the base; each copy adds its own offset
  absl::StatusOr<cuda::CudaApi::Opened> opened =
      api_->OpenRegion(ordinal, region);
  if (!opened.ok()) return opened.status();
  mappings_[*key] = Mapping{*opened, 1};
  return *opened;
}

void CudaIpc::Unmap(const std::string& key, int ordinal,
                    const cuda::CudaApi::Opened& opened) const {
  if (key.empty()) {  // not shared
    if (absl::Status s = api_->CloseRegion(ordinal, opened); !s.ok()) {
      SPDLOG_WARN("CUDA IPC: {}", s.ToString());
    }
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = mappings_.find(key);
  if (it == mappings_.end() || --it->second.users > 0) return;
  if (absl::Status s = api_->CloseRegion(ordinal, it->second.opened); !s.ok()) {
    SPDLOG_WARN("CUDA IPC: {}", s.ToString());
  }
  mappings_.erase(it);
}

absl::Status CudaIpc::CopyIn(const transport::IpcShard& shard,
                             const GpuAddress& dst) const {
  if (!available_.ok()) return available_;
  if (dst.address == nullptr || dst.ordinal < 0) {
    return absl::InvalidArgumentError("CUDA IPC: no destination address");
  }
  std::string key;
  absl::StatusOr<cuda::CudaApi::Opened> opened = Map(shard, dst.ordinal, &key);
  if (!opened.ok()) return opened.status();
  absl::Status s;
  // What the peer says is checked against what CUDA mapped (where the
  // driver says its size): a value that would lie outside it is refused,
  // never read.
  if (opened->size != 0 && (shard.offset > opened->size ||
                            shard.bytes > opened->size - shard.offset)) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC: a value of ", shard.bytes, " bytes at offset ", shard.offset,
        " lies outside the exported region of ", opened->size, " bytes"));
  } else {
    s = api_->CopyDeviceToDevice(
        dst.ordinal, dst.address,
        static_cast<const char*>(opened->base) + shard.offset, shard.bytes);
  }
  Unmap(key, dst.ordinal, *opened);
  return s;
}

}  // namespace plexus
