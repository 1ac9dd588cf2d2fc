// CUDA IPC between workers of one host, as far as a machine without a GPU
// can check it: which path a shard takes (IpcPossible), and that a worker
// without CUDA says why it has none and takes the host-staged path. The
// CUDA calls themselves run in tests/gpu.
#include "plexus/worker/cuda_ipc.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

// A ready value in device memory: in a CUDA GPU's (as the CUDA plugin's
// buffers say) or not.
class ReadyDeviceBuffer : public DeviceBuffer {
 public:
  ReadyDeviceBuffer(size_t n, bool on_gpu) : bytes_(n, 7), on_gpu_(on_gpu) {}
  size_t size() const override { return bytes_.size(); }
  absl::Status Await() const override { return absl::OkStatus(); }
  const void* host_address() const override { return nullptr; }
  absl::Status CopyToHost(void* dst) const override {
    std::memcpy(dst, bytes_.data(), bytes_.size());
    return absl::OkStatus();
  }
  bool in_gpu_memory() const override { return on_gpu_; }

 private:
  std::vector<char> bytes_;
  bool on_gpu_;
};

std::shared_ptr<Storage> OnDevice(bool on_gpu) {
  return Storage::OnDevice(std::make_shared<ReadyDeviceBuffer>(64, on_gpu));
}

TEST(IpcPossibleTest, OnlyAGpuValueToAPeerOfThisHostThatOpensIt) {
  const absl::Status here = absl::OkStatus();
  const absl::Status no_cuda = absl::UnavailableError("no libcudart here");
  auto gpu = OnDevice(true);
  auto cpu_device = OnDevice(false);
  auto host = *Storage::Allocate(64);
  EXPECT_TRUE(IpcPossible(*gpu, /*shares_memory=*/true,
                          /*peer_opens_cuda_ipc=*/true, here)
                  .ok());
  struct Case {
    const Storage* data;
    bool shares_memory;
    bool peer_opens;
    const absl::Status* here;
    const char* says;
  };
  const Case cases[] = {
      {host.get(), true, true, &here, "host memory"},
      {gpu.get(), false, true, &here, "unix socket"},
      {gpu.get(), true, true, &no_cuda, "no libcudart here"},
      {gpu.get(), true, false, &here, "receiving worker does not open"},
      {cpu_device.get(), true, true, &here, "not in a CUDA GPU"},
  };
  for (const Case& c : cases) {
    absl::Status s =
        IpcPossible(*c.data, c.shares_memory, c.peer_opens, *c.here);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
  }
}

TEST(CudaIpcTest, AWorkerWithoutCudaSaysWhyAndDoesNothing) {
  // The CPU plugin, turned off, and (on a machine without CUDA, as CI) no
  // CUDA runtime: each says why, and no call reaches CUDA.
  EXPECT_NE(CudaIpc::Create(true, "cpu", "")
                ->available()
                .message()
                .find("'cpu', not CUDA"),
            std::string::npos);
  EXPECT_NE(CudaIpc::Create(false, "cuda", "")
                ->available()
                .message()
                .find("--no-cuda-ipc"),
            std::string::npos);
  std::unique_ptr<CudaIpc> cuda = CudaIpc::Create(true, "cuda", "/nowhere.so");
  if (cuda->available().ok()) GTEST_SKIP() << "this machine has a CUDA GPU";
  EXPECT_FALSE(cuda->available().message().empty());
  ReadyDeviceBuffer buffer(64, true);
  EXPECT_EQ(cuda->Export(buffer).status(), cuda->available());
  transport::IpcShard shard;
  EXPECT_EQ(cuda->CopyIn(shard, GpuAddress{&shard, 0}), cuda->available());
  // A POSIX fd export too: nothing is imported, the shard keeps its fd.
  transport::IpcShard fd_shard;
  fd_shard.kind = transport::IpcShard::Kind::kPosixFd;
  fd_shard.fd = transport::SharedFd(dup(0));
  fd_shard.mapping_size = 2 << 20;
  EXPECT_EQ(cuda->CopyIn(fd_shard, GpuAddress{&shard, 0}), cuda->available());
  EXPECT_TRUE(fd_shard.fd.valid());
}

}  // namespace
}  // namespace plexus
