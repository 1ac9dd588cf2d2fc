#include "plexus/executors/cuda/nccl_api.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus::cuda {
namespace {

using ::testing::HasSubstr;

// Where NCCL is installed (the CUDA toolkit's libnccl.so.2 on the
// development machines and in CI) it loads without a GPU and says its
// version; where it is not, the error names every file tried.
TEST(NcclApiTest, LoadsOrSaysWhyNot) {
  absl::StatusOr<const NcclApi*> api =
      NcclApi::Load({"/nonexistent", "/usr/local/cuda/lib",
                     "/usr/local/cuda-13.0/lib", "/usr/local/cuda/lib64"});
  if (!api.ok()) {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(api.status().message(), HasSubstr("NCCL is not available"));
    EXPECT_THAT(api.status().message(), HasSubstr("/nonexistent/libnccl.so.2"));
    GTEST_SKIP() << "no NCCL here: " << api.status();
  }
  EXPECT_GE((*api)->version(), 21400) << (*api)->path();  // 2.14: nonblocking
  EXPECT_EQ(*NcclApi::Load({}), *api);  // one table per process
}

// A unique id is rank 0's bootstrap address (a listening socket): NCCL
// makes one without a GPU (checked on the 2-core development machines,
// which have none). Two ids differ.
TEST(NcclApiTest, MakesUniqueIdsWithoutAGpu) {
  absl::StatusOr<const NcclApi*> api =
      NcclApi::Load({"/usr/local/cuda/lib", "/usr/local/cuda-13.0/lib"});
  if (!api.ok()) GTEST_SKIP() << "no NCCL here: " << api.status();
  absl::StatusOr<NcclUniqueId> a = (*api)->GetUniqueId();
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<NcclUniqueId> b = (*api)->GetUniqueId();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->bytes, b->bytes);
}

}  // namespace
}  // namespace plexus::cuda
