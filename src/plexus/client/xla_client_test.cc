// XLA programs from the C++ client, against a real embedded cluster whose
// workers load the CPU PJRT plugin: a StableHLO module registered with
// Client::CompileXla runs on every island of a slice that spans two hosts,
// and a program whose declared outputs disagree with what XLA compiled
// fails with both shapes named.
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/client/client.h"
#include "plexus/client/cluster_fixture.h"

namespace plexus {
namespace {

// Per island: out = x * x + y on float32[2].
constexpr char kModule[] = R"(
module @square_add {
  func.func public @main(%x: tensor<2xf32>, %y: tensor<2xf32>)
      -> tensor<2xf32> {
    %s = stablehlo.multiply %x, %x : tensor<2xf32>
    %a = stablehlo.add %s, %y : tensor<2xf32>
    return %a : tensor<2xf32>
  }
}
)";

// xla.CompileOptionsProto for one replica and one partition on device 0
// (executable_build_options { num_replicas: 1 num_partitions: 1 }); Python
// clients get theirs from jaxlib.
const std::string kOneDevice("\x1a\x04\x20\x01\x28\x01", 6);

class XlaClientTest : public EmbeddedClusterTest<2, 1> {
 protected:
  static void SetUpTestSuite() {
    // Workers inherit the server's environment.
    setenv("PLEXUS_PJRT_PLUGIN", PLEXUS_TEST_PJRT_PLUGIN, /*overwrite=*/1);
    EmbeddedClusterTest::SetUpTestSuite();
  }

  proto::XlaProgram Program() {
    proto::XlaProgram xla;
    xla.set_module(kModule);
    xla.set_platform("cpu");
    proto::XlaIsland* island = xla.add_islands();
    island->add_devices(0);
    island->set_compile_options(kOneDevice);
    return xla;
  }
};

TEST_F(XlaClientTest, EveryIslandRunsTheModuleOnItsShards) {
  auto slice = client_->CreateSlice({.num_devices = 2});
  ASSERT_TRUE(slice.ok()) << slice.status();
  ASSERT_EQ((*slice)->num_hosts(), 2);
  const ArgSpec arg{{DType::kF32, {4}}, Sharding::Split(0)};
  auto program =
      client_->CompileXla(*slice, "square_add", Program(), {arg, arg}, {arg});
  ASSERT_TRUE(program.ok()) << program.status();
  std::vector<float> x = {1, 2, 3, 4}, y = {10, 20, 30, 40};
  auto fx = client_->Put(*slice, x.data(), arg);
  auto fy = client_->Put(*slice, y.data(), arg);
  ASSERT_TRUE(fx.ok() && fy.ok());
  auto out = client_->Call(**program, {*fx, *fy});
  ASSERT_TRUE(out.ok()) << out.status();
  auto again = client_->Call(**program, {(*out)[0], *fy});  // chained
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<float> got(4);
  ASSERT_TRUE(client_->Fetch((*again)[0], got.data()).ok());
  for (int i = 0; i < 4; ++i) {
    const float first = x[i] * x[i] + y[i];
    EXPECT_EQ(got[i], first * first + y[i]) << i;
  }
}

TEST_F(XlaClientTest, DeclaredOutputsThatDisagreeWithXlaAreAnErrorNotACrash) {
  auto slice = client_->CreateSlice({.num_devices = 1});
  ASSERT_TRUE(slice.ok()) << slice.status();
  const ArgSpec two{{DType::kF32, {2}}, Sharding::Replicated()};
  const ArgSpec three{{DType::kF32, {3}}, Sharding::Replicated()};
  auto program =
      client_->CompileXla(*slice, "lies", Program(), {two, two}, {three});
  ASSERT_TRUE(program.ok()) << program.status();
  std::vector<float> v = {1, 2};
  auto f = client_->Put(*slice, v.data(), two);
  ASSERT_TRUE(f.ok());
  auto out = client_->Call(**program, {*f, *f});
  ASSERT_TRUE(out.ok());
  absl::Status s = client_->Wait((*out)[0]);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("float32[2]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("float32[3]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'lies'"), std::string::npos) << s;
  // Partial inputs are refused when the program is registered.
  const ArgSpec partial{{DType::kF32, {2}}, Sharding::Partial()};
  auto refused =
      client_->CompileXla(*slice, "p", Program(), {partial, two}, {two});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  // The worker still serves.
  auto ok = client_->Call(
      **client_->CompileXla(*slice, "fine", Program(), {two, two}, {two}),
      {*f, *f});
  ASSERT_TRUE(ok.ok());
  std::vector<float> got(2);
  ASSERT_TRUE(client_->Fetch((*ok)[0], got.data()).ok());
  EXPECT_EQ(got[0], 2);
  EXPECT_EQ(got[1], 6);
}

TEST_F(XlaClientTest, CompileOptionsThatWouldAbortXlaAreRefused) {
  auto slice = client_->CreateSlice({.num_devices = 1});
  ASSERT_TRUE(slice.ok()) << slice.status();
  const ArgSpec two{{DType::kF32, {2}}, Sharding::Replicated()};
  proto::XlaProgram xla = Program();
  // Empty options: XLA would CHECK-fail on zero replicas and abort.
  xla.mutable_islands(0)->set_compile_options("");
  auto program =
      client_->CompileXla(*slice, "no_options", xla, {two, two}, {two});
  ASSERT_TRUE(program.ok()) << program.status();
  std::vector<float> v = {1, 2};
  auto f = client_->Put(*slice, v.data(), two);
  ASSERT_TRUE(f.ok());
  auto out = client_->Call(**program, {*f, *f});
  ASSERT_TRUE(out.ok());
  absl::Status s = client_->Wait((*out)[0]);
  EXPECT_NE(s.message().find("no executable_build_options"), std::string::npos)
      << s;
  // The worker is alive and serves the next call.
  auto fine = client_->CompileXla(*slice, "fine", Program(), {two, two}, {two});
  ASSERT_TRUE(fine.ok());
  auto again = client_->Call(**fine, {*f, *f});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(client_->Wait((*again)[0]).ok());
}

}  // namespace
}  // namespace plexus
