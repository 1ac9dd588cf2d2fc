// park and unpark (kernels_park.cc): a device's block to its file and back,
// the file gone once read; a client may not compile either.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/builtin/catalogue.h"
#include "plexus/executors/builtin/kernel.h"

namespace plexus::builtin {
namespace {

using ::testing::HasSubstr;

class ParkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/plexus-park-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  absl::Status Run(const char* kernel, const void* in, void* out,
                   const TensorSpec& spec, int shard,
                   const std::string& key = "c1-b7") {
    const Kernel* k = KernelRegistry::Global().Find(kernel);
    if (k == nullptr) return absl::NotFoundError(kernel);
    Attrs attrs = {{"dir", dir_}, {"key", key}};
    KernelContext ctx;
    ctx.attrs = &attrs;
    ctx.shard = shard;
    ctx.num_shards = 2;
    if (in != nullptr) ctx.inputs.push_back({spec, in});
    ctx.outputs.push_back(
        {in != nullptr ? TensorSpec{DType::kU8, {1}} : spec, out});
    return k->Run(ctx);
  }

  std::string dir_;
};

TEST_F(ParkTest, ABlockGoesToItsFileAndComesBackBitForBit) {
  const TensorSpec spec{DType::kF32, {3}};
  const std::vector<float> a = {1.5f, -2.0f, 3.25f}, b = {7.0f, 8.0f, 9.0f};
  uint8_t token = 0;
  ASSERT_TRUE(Run("park", a.data(), &token, spec, 0).ok());
  EXPECT_EQ(token, 1);
  ASSERT_TRUE(Run("park", b.data(), &token, spec, 1).ok());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/c1-b7-s0"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/c1-b7-s0.tmp"));
  std::vector<float> got(3);
  ASSERT_TRUE(Run("unpark", nullptr, got.data(), spec, 1).ok());
  EXPECT_EQ(got, b);  // each device its own block
  ASSERT_TRUE(Run("unpark", nullptr, got.data(), spec, 0).ok());
  EXPECT_EQ(got, a);
  // Read once: the file is gone, and a second read says so.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/c1-b7-s0"));
  absl::Status again = Run("unpark", nullptr, got.data(), spec, 0);
  EXPECT_EQ(again.code(), absl::StatusCode::kDataLoss) << again;
  EXPECT_THAT(again.message(), HasSubstr("c1-b7-s0 cannot be read"));
}

TEST_F(ParkTest, AFileOfAnotherSizeAndAKeyOutsideTheDirectoryAreRefused) {
  const std::vector<float> a = {1, 2, 3};
  uint8_t token = 0;
  ASSERT_TRUE(Run("park", a.data(), &token, {DType::kF32, {3}}, 0).ok());
  std::vector<float> got(4);
  absl::Status s = Run("unpark", nullptr, got.data(), {DType::kF32, {4}}, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("holds 12 bytes"));
  s = Run("park", a.data(), &token, {DType::kF32, {3}}, 0, "../escape");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(ParkSignatureTest, AClientCannotCompileEither) {
  for (const char* name : {"park", "unpark"}) {
    const KernelSignature* k = KernelCatalogue::Global().Find(name);
    ASSERT_NE(k, nullptr) << name;
    EXPECT_TRUE(k->server_only());
    auto out = k->InferOutputs({}, 1, {});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(out.status().message(), HasSubstr("the server's own"));
  }
  EXPECT_FALSE(KernelCatalogue::Global().Find("identity")->server_only());
}

}  // namespace
}  // namespace plexus::builtin
