// The LAPACK handlers registered with the real CPU PJRT plugin (xla-cpu-pjrt
// wheel): a module calling a LAPACK custom call target as JAX emits it
// compiles and runs, batched, with LAPACK's info; a call JAX would not emit
// fails its run with an error naming the target; a plugin without the FFI
// extension is refused by name.
#include "plexus/executors/xla/lapack/lapack_handlers.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pjrt_c_api.h"
#include "plexus/executors/xla/pjrt_runtime.h"
#include "plexus/executors/xla/xla_test_util.h"

namespace plexus::xla {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two 2x2 f32 matrices through lapack_spotrf_ffi, as jax.lax.linalg.cholesky
// lowers it on CPU (column-major layouts, the factor aliasing the operand),
// returning the factor and info as they are.
constexpr char kPotrfModule[] = R"(
module @m {
  func.func public @main(%a: tensor<2x2x2xf32>)
      -> (tensor<2x2x2xf32>, tensor<2xi32>) {
    %0:2 = stablehlo.custom_call @lapack_spotrf_ffi(%a) {
        api_version = 4 : i32,
        backend_config = {uplo = UPLO : ui8},
        mhlo.frontend_attributes = {num_batch_dims = "1"},
        operand_layouts = [dense<[1, 2, 0]> : tensor<3xindex>],
        output_operand_aliases = [#stablehlo.output_operand_alias<
            output_tuple_indices = [0], operand_index = 0,
            operand_tuple_indices = []>],
        result_layouts = [dense<[1, 2, 0]> : tensor<3xindex>,
                          dense<0> : tensor<1xindex>]}
        : (tensor<2x2x2xf32>) -> (tensor<2x2x2xf32>, tensor<2xi32>)
    return %0#0, %0#1 : tensor<2x2x2xf32>, tensor<2xi32>
  }
}
)";

std::string PotrfModule(char uplo) {
  return absl::StrReplaceAll(
      kPotrfModule, {{"UPLO", std::to_string(static_cast<int>(uplo))}});
}

absl::StatusOr<std::unique_ptr<PjrtRuntime>> CpuRuntime() {
  PjrtOptions o;
  o.plugin_path = PLEXUS_TEST_PJRT_PLUGIN;
  return PjrtRuntime::Load(o);
}

// Runs `exe` on `a` to its end: its outputs, or the run's error.
absl::StatusOr<PjrtRuntime::Outputs> RunToEnd(const PjrtRuntime& runtime,
                                              const PjrtExecutable& exe,
                                              const float* a) {
  absl::Notification ended;
  absl::Status end;
  auto outs = runtime.Execute(
      exe, {{XlaArgument{TensorSpec{DType::kF32, {2, 2, 2}}, a}}}, "potrf",
      [&](absl::Status s) {
        end = s;
        ended.Notify();
      });
  if (!outs.ok()) return outs.status();
  if (!ended.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    return absl::DeadlineExceededError("the run did not end in 60 s");
  }
  if (!end.ok()) return end;
  return outs;
}

TEST(LapackHandlersTest, ACpuRuntimeRunsJaxsLapackCustomCalls) {
  auto runtime = CpuRuntime();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_TRUE((*runtime)->lapack_handlers().ok())
      << (*runtime)->lapack_handlers();
  auto exe = (*runtime)->Compile(PotrfModule('L'), testing::OptionsOnDevice(0));
  ASSERT_TRUE(exe.ok()) << exe.status();

  // Row-major logical [[4, 2], [2, 3]] (positive definite) and
  // [[1, 2], [2, 1]] (not).
  alignas(64) const float a[8] = {4, 2, 2, 3, 1, 2, 2, 1};
  auto outs = RunToEnd(**runtime, **exe, a);
  ASSERT_TRUE(outs.ok()) << outs.status();
  float factor[8];
  int32_t info[2];
  ASSERT_TRUE((*outs)[0][0]->CopyToHost(factor).ok());
  ASSERT_TRUE((*outs)[0][1]->CopyToHost(info).ok());
  EXPECT_THAT(info, ElementsAre(0, 2));
  // L = [[2, 0], [1, sqrt 2]]; above the diagonal, the input as it was.
  EXPECT_FLOAT_EQ(factor[0], 2);
  EXPECT_FLOAT_EQ(factor[1], 2);
  EXPECT_FLOAT_EQ(factor[2], 1);
  EXPECT_FLOAT_EQ(factor[3], std::sqrt(2.0f));
}

TEST(LapackHandlersTest, ASerializedExecutableRunsWherePeersLoadIt) {
  // Workers hand compiled programs to each other (XlaExecutor): the custom
  // call is found again in the runtime that loads the bytes.
  auto compiler = CpuRuntime();
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  const std::string options = testing::OptionsOnDevice(0);
  auto compiled = (*compiler)->Compile(PotrfModule('L'), options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  auto bytes = (*compiler)->Serialize(**compiled);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto peer = CpuRuntime();
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto loaded = (*peer)->Deserialize(*bytes, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  alignas(64) const float a[8] = {4, 2, 2, 3, 1, 2, 2, 1};
  auto outs = RunToEnd(**peer, **loaded, a);
  ASSERT_TRUE(outs.ok()) << outs.status();
  int32_t info[2];
  ASSERT_TRUE((*outs)[0][1]->CopyToHost(info).ok());
  EXPECT_THAT(info, ElementsAre(0, 2));
}

TEST(LapackHandlersTest, ACallJaxWouldNotEmitFailsItsRunNamingTheTarget) {
  auto runtime = CpuRuntime();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto exe = (*runtime)->Compile(PotrfModule('X'), testing::OptionsOnDevice(0));
  ASSERT_TRUE(exe.ok()) << exe.status();
  alignas(64) const float a[8] = {4, 2, 2, 3, 1, 2, 2, 1};
  auto outs = RunToEnd(**runtime, **exe, a);
  ASSERT_FALSE(outs.ok());
  EXPECT_THAT(outs.status().message(),
              HasSubstr("lapack_spotrf_ffi: spotrf: uplo is 'X' (88)"));
}

TEST(LapackHandlersTest, RegisteringTwiceIsHarmless) {
  auto first = CpuRuntime();
  auto second = CpuRuntime();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE((*first)->lapack_handlers().ok());
  EXPECT_TRUE((*second)->lapack_handlers().ok());
}

TEST(LapackHandlersTest, APluginWithoutTheFfiExtensionIsRefusedByName) {
  PJRT_Api api;
  std::memset(&api, 0, sizeof(api));
  absl::Status s = lapack::RegisterLapackHandlers(&api);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("has no FFI extension"));

  // An FFI extension from before handler registration (two functions).
  PJRT_Extension_Base old_extension;
  std::memset(&old_extension, 0, sizeof(old_extension));
  old_extension.struct_size = 40;
  old_extension.type = PJRT_Extension_Type_FFI;
  api.extension_start = &old_extension;
  s = lapack::RegisterLapackHandlers(&api);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("FFI extension (40 bytes) cannot "
                                     "register handlers; it needs 48"));
}

}  // namespace
}  // namespace plexus::xla
