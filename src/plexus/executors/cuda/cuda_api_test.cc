#include "plexus/executors/cuda/cuda_api.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus::cuda {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

bool HasGpu() { return access("/dev/nvidiactl", F_OK) == 0; }

TEST(CudaApiTest, FindsTheLibrariesOfAPluginWheel) {
  fs::path root = fs::path(testing::TempDir()) / "cuda_api_test_site";
  fs::remove_all(root);
  fs::create_directories(root / "jax_plugins" / "xla_cuda13");
  fs::create_directories(root / "nvidia" / "nccl" / "lib");
  fs::create_directories(root / "nvidia" / "cuda_runtime" / "lib");
  fs::create_directories(root / "nvidia" / "cu13" / "lib64");
  fs::create_directories(root / "nvidia" / "no_libs");
  std::string plugin =
      (root / "jax_plugins" / "xla_cuda13" / "xla_cuda_plugin.so").string();
  std::ofstream(plugin) << "";
  EXPECT_THAT(CudaApi::LibraryDirsBeside(plugin),
              ElementsAre((root / "nvidia/cu13/lib64").string(),
                          (root / "nvidia/cuda_runtime/lib").string(),
                          (root / "nvidia/nccl/lib").string()));
  // No nvidia folder beside the plugin: nothing to search.
  fs::remove_all(root / "nvidia");
  EXPECT_TRUE(CudaApi::LibraryDirsBeside(plugin).empty());
  fs::remove_all(root);
}

// On a machine with no GPU (CI), loading fails or finds no device, with a
// message naming what is missing; it never crashes. Where a GPU is there,
// it is counted.
TEST(CudaApiTest, SaysWhyThereIsNoCuda) {
  absl::StatusOr<const CudaApi*> api = CudaApi::Load({"/nonexistent"});
  if (!api.ok()) {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(api.status().message(), HasSubstr("CUDA is not available"));
    EXPECT_THAT(api.status().message(), HasSubstr("/nonexistent/"));
    ASSERT_FALSE(HasGpu()) << api.status();
    return;
  }
  absl::StatusOr<int> n = (*api)->DeviceCount();
  if (HasGpu()) {
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_GE(*n, 1);
  } else if (!n.ok()) {
    EXPECT_THAT(n.status().message(), HasSubstr("cudaGetDeviceCount failed"));
  } else {
    EXPECT_EQ(*n, 0);
  }
  // The same table whatever a later caller asks.
  EXPECT_EQ(*CudaApi::Load({}), *api);
}

// Every CUDA call is bound by the name the driver exports: checked against
// the toolkit's driver stub (the build machine's CUDA toolkit; skipped
// without one), loaded in a child process (Load is once per process). The
// stub's calls all fail: each failure is a status naming the call.
TEST(CudaApiTest, BindsEveryCallByTheNameTheDriverExports) {
  const fs::path toolkit = "/usr/local/cuda/lib64";
  if (!fs::exists(toolkit / "stubs" / "libcuda.so") ||
      !fs::exists(toolkit / "libcudart.so.13")) {
    GTEST_SKIP() << "no CUDA 13 toolkit with its driver stub";
  }
  if (HasGpu()) GTEST_SKIP() << "a real driver is found first";
  const fs::path dir = fs::path(testing::TempDir()) / "cuda_api_test_stub";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink(toolkit / "stubs" / "libcuda.so", dir / "libcuda.so.1");
  fs::create_symlink(toolkit / "libcudart.so.13", dir / "libcudart.so.13");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        absl::StatusOr<const CudaApi*> api = CudaApi::Load({dir.string()});
        if (!api.ok()) {
          fprintf(stderr, "load: %s\n", api.status().ToString().c_str());
          _exit(1);
        }
        int x = 0;
        absl::StatusOr<IpcRegion> exported = (*api)->ExportRegion(0, &x);
        IpcRegion region;
        region.kind = IpcRegion::Kind::kPosixFd;
        region.fd = 0;
        region.mapping_size = 2 << 20;
        absl::StatusOr<CudaApi::Opened> opened = (*api)->OpenRegion(0, region);
        fprintf(stderr, "export: %s\nopen: %s\n",
                exported.status().ToString().c_str(),
                opened.status().ToString().c_str());
        _exit(!exported.ok() && !opened.ok() &&
                      exported.status().message().find("failed: ") !=
                          std::string::npos &&
                      opened.status().message().find("failed: ") !=
                          std::string::npos
                  ? 0
                  : 2);
      },
      testing::ExitedWithCode(0), "export: UNAVAILABLE: cuda.*failed");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace plexus::cuda
