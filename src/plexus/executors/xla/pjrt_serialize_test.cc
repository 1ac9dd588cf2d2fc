// Serialized executables against the real CPU PJRT plugin (xla-cpu-pjrt
// wheel): one runtime compiles and serializes, a fresh runtime (another
// PJRT client) loads the bytes without compiling, and both compute the
// same outputs on the same device. XlaExecutor's cache takes them by
// content, refuses bytes for other devices, and serves them to peers.
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/xla/pjrt_runtime.h"
#include "plexus/executors/xla/xla_executor.h"
#include "plexus/executors/xla/xla_test_util.h"

namespace plexus::xla {
namespace {

using ::testing::HasSubstr;
using testing::kTanhModule;
using testing::OptionsOnDevice;

PjrtOptions Options() {
  PjrtOptions o;
  o.plugin_path = PLEXUS_TEST_PJRT_PLUGIN;
  o.cpu_device_count = 2;
  return o;
}

// The outputs of one run of `exe` on x, y, read back to the host.
std::vector<float> Outputs(const PjrtRuntime& runtime,
                           const PjrtExecutable& exe) {
  alignas(64) static const float x[6] = {0.5f, -1, 2, 0, 0.25f, -3};
  alignas(64) static const float y[6] = {1, 2, 3, 4, 5, 6};
  const TensorSpec m{DType::kF32, {2, 3}};
  // CopyToHost waits for the run; x and y outlive it (static).
  auto outs = runtime.Execute(exe, {{{m, x}, {m, y}}}, "test program",
                              [](absl::Status) {});
  EXPECT_TRUE(outs.ok()) << outs.status();
  if (!outs.ok()) return {};
  std::vector<float> got(7);
  EXPECT_TRUE((*outs)[0][0]->CopyToHost(got.data()).ok());
  EXPECT_TRUE((*outs)[0][1]->CopyToHost(got.data() + 6).ok());
  return got;
}

TEST(PjrtSerializeTest, AFreshRuntimeLoadsTheBytesAndComputesTheSame) {
  auto compiler = PjrtRuntime::Load(Options());
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  const std::string options = OptionsOnDevice(1);
  auto compiled = (*compiler)->Compile(kTanhModule, options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_EQ((*compiled)->device_indices(), std::vector<int>{1});
  auto bytes = (*compiler)->Serialize(**compiled);
  ASSERT_TRUE(bytes.ok()) << "the plugin refuses serialization: "
                          << bytes.status();
  ASSERT_FALSE(bytes->empty());

  auto fresh = PjrtRuntime::Load(Options());  // another PJRT client
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto loaded = (*fresh)->Deserialize(*bytes, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->device_indices(), std::vector<int>{1});
  EXPECT_EQ((*loaded)->outputs(), (*compiled)->outputs());
  EXPECT_EQ((*loaded)->temp_bytes(), (*compiled)->temp_bytes());

  const std::vector<float> want = Outputs(**compiler, **compiled);
  const std::vector<float> got = Outputs(**fresh, **loaded);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "the loaded executable computes other values";
}

TEST(PjrtSerializeTest, BytesThatAreNoExecutableAreAnError) {
  auto runtime = PjrtRuntime::Load(Options());
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto loaded =
      (*runtime)->Deserialize("not an executable", OptionsOnDevice(0));
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("deserialize executable"));
}

TEST(PjrtSerializeTest, TheCacheLoadsServesAndNeverCompiles) {
  XlaExecutor live(Options());
  const std::string options = OptionsOnDevice(1);
  auto compiled = live.GetOrCompile(kTanhModule, options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const uint64_t key = XlaExecutor::Fingerprint(kTanhModule, options);
  EXPECT_NE(key, XlaExecutor::Fingerprint(kTanhModule, OptionsOnDevice(0)));
  auto served = live.Serialize(key);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->module, kTanhModule);
  EXPECT_EQ(served->compile_options, options);
  EXPECT_EQ(live.Serialize(key + 1).status().code(),
            absl::StatusCode::kNotFound);

  XlaExecutor spare(Options());
  // Bytes for device 1 do not pass for an island on device 0.
  auto wrong = spare.GetOrLoad(*served, {0});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("devices [1], not [0]"));
  auto loaded = spare.GetOrLoad(*served, {1});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(spare.serialized_loads(), 1);
  // The cache holds it under its content: a program asking for it compiles
  // nothing.
  auto same = spare.GetOrCompile(kTanhModule, options);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->get(), loaded->get());
  EXPECT_EQ(spare.Lookup(kTanhModule, options).get(), loaded->get());
  EXPECT_EQ(spare.compiles(), 0);
  EXPECT_EQ(spare.cache_hits(), 2);
  EXPECT_EQ(Outputs(**spare.Runtime(), **loaded),
            Outputs(**live.Runtime(), **compiled));

  // A spare that loaded it serves the next one the bytes it loaded: the
  // CPU plugin's serialization of a deserialized executable leaves out its
  // kernels' object code, and that one fails to run ("Function
  // multiply_add_fusion not found").
  auto again = spare.Serialize(key);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->executable == served->executable)
      << "served " << again->executable.size() << " bytes, loaded "
      << served->executable.size();
  XlaExecutor next(Options());
  auto second_hand = next.GetOrLoad(*again, {1});
  ASSERT_TRUE(second_hand.ok()) << second_hand.status();
  EXPECT_EQ(Outputs(**next.Runtime(), **second_hand),
            Outputs(**live.Runtime(), **compiled));
}

// A failed compile is cached, so that content will never be served here:
// the peer asking hears so (FailedPrecondition, with the compile error),
// not NotFound, which a compile not begun yet also answers.
TEST(PjrtSerializeTest, AFailedCompileIsServedAsFinalNamingItsError) {
  XlaExecutor executor(Options());
  const std::string module = "module { this is not mlir }";
  const std::string options = OptionsOnDevice(0);
  const uint64_t key = XlaExecutor::Fingerprint(module, options);
  EXPECT_EQ(executor.Serialize(key).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_FALSE(executor.GetOrCompile(module, options).ok());
  absl::Status served = executor.Serialize(key).status();
  EXPECT_EQ(served.code(), absl::StatusCode::kFailedPrecondition) << served;
  EXPECT_THAT(served.message(), HasSubstr("failed to compile here"));
  EXPECT_THAT(served.message(), HasSubstr("XLA compile"));
}

// A worker whose plugin did not load compiles nothing: a peer asking it
// hears that at once (FailedPrecondition), not NotFound, which would keep
// the peer asking for kAwaitPeerCompile (30 s).
TEST(PjrtSerializeTest, AWorkerWhosePluginFailedToLoadAnswersFinal) {
  PjrtOptions o = Options();
  o.plugin_path = "/nonexistent/pjrt_plugin.so";
  XlaExecutor executor(o);
  const uint64_t key =
      XlaExecutor::Fingerprint(kTanhModule, OptionsOnDevice(0));
  // Before its first use nothing is known: the plugin may yet load.
  EXPECT_EQ(executor.Serialize(key).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_FALSE(executor.GetOrCompile(kTanhModule, OptionsOnDevice(0)).ok());
  absl::Status served = executor.Serialize(key).status();
  EXPECT_EQ(served.code(), absl::StatusCode::kFailedPrecondition) << served;
  EXPECT_THAT(served.message(), HasSubstr("PJRT plugin did not load"));
  EXPECT_THAT(served.message(), HasSubstr("/nonexistent/pjrt_plugin.so"));
}

}  // namespace
}  // namespace plexus::xla
