// The XLA executor against the real CPU PJRT plugin (xla-cpu-pjrt wheel):
// StableHLO text compiled once, run on host and device buffers, outputs
// left in device memory, errors as statuses.
#include "plexus/executors/xla/xla_executor.h"

#include <pthread.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/executors/xla/xla_test_util.h"
#include "plexus/store/storage.h"

namespace plexus::xla {
namespace {

using testing::kTanhModule;

// A serialized xla.CompileOptionsProto for one replica and one partition
// (executable_build_options { num_replicas: 1 num_partitions: 1 }), as
// jaxlib's CompileOptions.SerializeAsString() writes those fields. Clients
// send the full options that plexus.jit builds with jaxlib.
const std::string kOneDevice("\x1a\x04\x20\x01\x28\x01", 6);

PjrtOptions Options() {
  PjrtOptions o;
  o.plugin_path = PLEXUS_TEST_PJRT_PLUGIN;
  o.cpu_device_count = 2;
  return o;
}

// Queues one run and waits for its end (its `done`), as a worker's
// completion does.
absl::StatusOr<PjrtRuntime::Outputs> RunToEnd(
    const PjrtRuntime& runtime, const PjrtExecutable& exe,
    const std::vector<std::vector<XlaArgument>>& inputs) {
  absl::Notification ended;
  absl::Status end;
  auto outs = runtime.Execute(exe, inputs, "test program", [&](absl::Status s) {
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

// How many of this process's threads bear each name
// (/proc/self/task/*/comm).
std::map<std::string, int> ThreadNames() {
  std::map<std::string, int> names;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) ++names[name];
  }
  return names;
}

std::string ThisThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// The chain tests' program and inputs: the tanh module compiled for one
// device (out = tanh(x) * y + y), and x and y, 2x3 float32.
struct TanhChain {
  XlaExecutor executor{Options()};
  absl::StatusOr<std::shared_ptr<const PjrtExecutable>> exe =
      executor.GetOrCompile(kTanhModule, kOneDevice);
  alignas(64) float x[6] = {0.5f, -1, 2, 0, 0.25f, -3};
  alignas(64) float y[6] = {1, 0, 1, 0, 1, 0};
  const TensorSpec m{DType::kF32, {2, 3}};
  const PjrtRuntime& runtime() { return **executor.Runtime(); }
};

TEST(XlaExecutorTest, ThePluginsThreadsAreNamedAsThePlugins) {
  // A new thread takes its creator's name: the pools a client starts would
  // bear the name of the thread that loaded it (a worker's stream reader).
  const std::string own = ThisThreadName();
  pthread_setname_np(pthread_self(), "xla-test-load");
  auto runtime = PjrtRuntime::Load(Options());
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto exe = (*runtime)->Compile(kTanhModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::map<std::string, int> names = ThreadNames();
  EXPECT_EQ(ThisThreadName(), "xla-test-load");  // given back
  EXPECT_EQ(names["xla-test-load"], 1);          // this thread alone
  EXPECT_GE(names["pjrt-plugin"], 1);
  pthread_setname_np(pthread_self(), own.c_str());
}

TEST(XlaExecutorTest, CompilesOnceAndRunsOnHostBuffers) {
  XlaExecutor executor(Options());
  auto runtime = executor.Runtime();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_EQ((*runtime)->platform(), "cpu");
  EXPECT_EQ((*runtime)->num_devices(), 2);

  auto exe = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  ASSERT_EQ((*exe)->outputs().size(), 2u);
  EXPECT_EQ((*exe)->outputs()[0], (TensorSpec{DType::kF32, {2, 3}}));
  EXPECT_EQ((*exe)->outputs()[1], (TensorSpec{DType::kF32, {}}));
  auto again = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(exe->get(), again->get());
  EXPECT_EQ(executor.compiles(), 1);
  EXPECT_EQ(executor.cache_hits(), 1);

  alignas(64) float x[6] = {0.5f, -1, 2, 0, 0.25f, -3};
  alignas(64) float y[6] = {1, 2, 3, 4, 5, 6};
  const TensorSpec m{DType::kF32, {2, 3}};
  const int64_t copied_in = MemoryTraffic::host_to_device().load();
  const int64_t copied_out = MemoryTraffic::device_to_host().load();
  for (int round = 0; round < 3; ++round) {
    auto outs = RunToEnd(**runtime, **exe, {{{m, x}, {m, y}}});
    ASSERT_TRUE(outs.ok()) << outs.status();
    ASSERT_EQ(outs->size(), 1u);
    ASSERT_EQ((*outs)[0].size(), 2u);
    const PjrtBuffer& a = *(*outs)[0][0];
    const PjrtBuffer& sum = *(*outs)[0][1];
    EXPECT_EQ(a.size(), 6 * sizeof(float));
    EXPECT_EQ(a.device(), 0);
    ASSERT_TRUE(a.Await().ok());
    // CPU device memory is the host's: read in place, no copy.
    ASSERT_NE(a.host_address(), nullptr);
    const float* out = static_cast<const float*>(a.host_address());
    float expect_sum = 0;
    for (int i = 0; i < 6; ++i) {
      EXPECT_NEAR(out[i], std::tanh(x[i]) * y[i] + y[i], 1e-5)
          << i;  // XLA tanh
      expect_sum += x[i];
    }
    float s = 0;
    ASSERT_TRUE(sum.CopyToHost(&s).ok());
    EXPECT_FLOAT_EQ(s, expect_sum);
  }
  EXPECT_EQ(MemoryTraffic::host_to_device().load(), copied_in);  // in place
  EXPECT_EQ(MemoryTraffic::device_to_host().load(),
            copied_out + 3 * static_cast<int64_t>(sizeof(float)));
}

// A block of host memory read by run after run (a weight put once) is
// wrapped for its device once and kept with the block, not once per run;
// the wrapping reads the block in place, so it sees what the block holds.
TEST(XlaExecutorTest, AHostBlockIsWrappedOnceAndKeptWithIt) {
  XlaExecutor executor(Options());
  auto runtime = executor.Runtime();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto exe = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  alignas(64) float x[6] = {0.5f, -1, 2, 0, 0.25f, -3};
  alignas(64) float y[6] = {1, 2, 3, 4, 5, 6};
  const TensorSpec m{DType::kF32, {2, 3}};
  HostViews x_views, y_views;
  const int64_t made = (*runtime)->host_views_made();
  for (int round = 0; round < 4; ++round) {
    y[0] = static_cast<float>(round);  // read in place, as it is now
    auto outs = RunToEnd(
        **runtime, **exe,
        {{{m, x, nullptr, false, &x_views}, {m, y, nullptr, false, &y_views}}});
    ASSERT_TRUE(outs.ok()) << outs.status();
    const PjrtBuffer& a = *(*outs)[0][0];
    ASSERT_TRUE(a.Await().ok());
    const float* out = static_cast<const float*>(a.host_address());
    for (int i = 0; i < 6; ++i) {
      EXPECT_NEAR(out[i], std::tanh(x[i]) * y[i] + y[i], 1e-5) << i;
    }
  }
  EXPECT_EQ((*runtime)->host_views_made(), made + 2);  // x and y, once
  EXPECT_EQ(x_views.size(), 1u);
  EXPECT_EQ(y_views.size(), 1u);
  // Dropped with its block (as a Storage does before freeing it): the
  // next run reading the block wraps it again.
  y_views.Clear();
  ASSERT_TRUE(RunToEnd(**runtime, **exe,
                       {{{m, x, nullptr, false, &x_views},
                         {m, y, nullptr, false, &y_views}}})
                  .ok());
  EXPECT_EQ((*runtime)->host_views_made(), made + 3);
  // Without a place to keep them, each run wraps its host arguments (and
  // lets go of them at its end), as before.
  ASSERT_TRUE(RunToEnd(**runtime, **exe, {{{m, x}, {m, y}}}).ok());
  EXPECT_EQ((*runtime)->host_views_made(), made + 3);
}

TEST(XlaExecutorTest, ChainedRunsAreQueuedOnInputsNotReadyYet) {
  TanhChain chain;
  auto& [executor, exe, x, y, m] = chain;
  ASSERT_TRUE(exe.ok()) << exe.status();
  const PjrtRuntime& runtime = chain.runtime();
  const int64_t copied_out = MemoryTraffic::device_to_host().load();
  // out = tanh(value) * y + y, 50 times, each queued at once on the last
  // output (which need not have been computed yet) where it is; nothing
  // here waits until the last.
  constexpr int kRuns = 50;
  absl::Mutex mu;
  std::vector<int> ended;  // the runs' ends, in order
  std::vector<absl::Status> ends;
  absl::Notification all_ended;
  std::shared_ptr<const PjrtBuffer> value;
  std::vector<float> expect(x, x + 6);
  for (int round = 0; round < kRuns; ++round) {
    XlaArgument in =
        round == 0 ? XlaArgument{m, x} : XlaArgument{m, nullptr, value.get()};
    auto next = runtime.Execute(**exe, {{in, {m, y}}}, "test program",
                                [&, round](absl::Status s) {
                                  absl::MutexLock lock(&mu);
                                  ended.push_back(round);
                                  ends.push_back(s);
                                  if (ended.size() == kRuns) all_ended.Notify();
                                });
    ASSERT_TRUE(next.ok()) << next.status();
    value = (*next)[0][0];
    for (int i = 0; i < 6; ++i) expect[i] = std::tanh(expect[i]) * y[i] + y[i];
  }
  ASSERT_TRUE(all_ended.WaitForNotificationWithTimeout(absl::Seconds(60)));
  {
    absl::MutexLock lock(&mu);
    for (int r = 0; r < kRuns; ++r) {
      EXPECT_EQ(ended[r], r);
      EXPECT_TRUE(ends[r].ok()) << ends[r];
    }
  }
  EXPECT_EQ(MemoryTraffic::device_to_host().load(), copied_out);
  // As a store entry: in place on CPU, copied where it must be shared.
  std::shared_ptr<const Storage> held = Storage::OnDevice(value);
  EXPECT_EQ(held->kind(), MemoryKind::kDevice);
  auto host = Storage::InHostMemory(held, /*shareable=*/false);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->get(), held.get());
  const float* got = static_cast<const float*>((*host)->data());
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(got[i], expect[i], 1e-4) << i;
  EXPECT_EQ(MemoryTraffic::device_to_host().load(), copied_out);
}

TEST(XlaExecutorTest, ARunEndingWhileItsEndIsBeingWatchedIsNotReadAfter) {
  // A run not ended inside Execute has its partitions' completions watched
  // (PJRT_Event_OnReady). The last can fire as it is registered, and the
  // completion thread then frees the run: Execute must not read it after.
  // (It read the run's event list once more: a use after free that the
  // ASan stage caught in a worker, once in many thousand runs.) Many
  // short chained runs, each queued while the last may still run, so
  // that the window is met often.
  TanhChain chain;
  auto& [executor, exe, x, y, m] = chain;
  ASSERT_TRUE(exe.ok()) << exe.status();
  const PjrtRuntime& runtime = chain.runtime();
  constexpr int kRuns = 2000;
  absl::Mutex mu;
  int ended = 0;
  int failed = 0;
  absl::Notification all_ended;
  std::shared_ptr<const PjrtBuffer> last;
  for (int round = 0; round < kRuns; ++round) {
    XlaArgument in =
        round == 0 ? XlaArgument{m, x} : XlaArgument{m, nullptr, last.get()};
    auto next = runtime.Execute(**exe, {{in, {m, y}}}, "test program",
                                [&](absl::Status s) {
                                  absl::MutexLock lock(&mu);
                                  if (!s.ok()) failed++;
                                  if (++ended == kRuns) all_ended.Notify();
                                });
    ASSERT_TRUE(next.ok()) << next.status();
    last = (*next)[0][0];
  }
  ASSERT_TRUE(all_ended.WaitForNotificationWithTimeout(absl::Seconds(120)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(failed, 0);
}

TEST(XlaExecutorTest, AnOutputDroppedBeforeItsRunEndsIsSafe) {
  // The store may release a value (and its buffer) while the program that
  // makes it, or one that reads it, is still queued: PJRT keeps what a
  // queued run uses.
  XlaExecutor executor(Options());
  auto exe = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const PjrtRuntime& runtime = **executor.Runtime();
  alignas(64) float x[6] = {0.5f, -1, 2, 0, 0.25f, -3};
  alignas(64) float y[6] = {1, 2, 3, 4, 5, 6};
  const TensorSpec m{DType::kF32, {2, 3}};
  absl::Notification ended;
  std::shared_ptr<const PjrtBuffer> last;
  {
    auto first = runtime.Execute(**exe, {{{m, x}, {m, y}}}, "first",
                                 [](absl::Status) {});
    ASSERT_TRUE(first.ok()) << first.status();
    XlaArgument in{m, nullptr, (*first)[0][0].get()};
    PjrtRuntime::ArgumentReads reads;
    auto second = runtime.Execute(
        **exe, {{in, {m, y}}}, "second", [&](absl::Status) { ended.Notify(); },
        &reads);
    ASSERT_TRUE(second.ok()) << second.status();
    // The first run's output read where it is; `y` from host memory.
    EXPECT_EQ(reads, PjrtRuntime::ArgumentReads(
                         {{ArgumentRead::kAlias, ArgumentRead::kHost}}));
    last = (*second)[0][0];
  }  // the first run's outputs are dropped here
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // Its run has ended: Computed says so without waiting (what a fetch's
  // early answer asks, data_plane_server.cc), and reads the value in place.
  const std::optional<absl::Status> computed = last->Computed();
  ASSERT_TRUE(computed.has_value());
  EXPECT_TRUE(computed->ok()) << *computed;
  EXPECT_NE(last->host_address(), nullptr);
  ASSERT_TRUE(last->Await().ok());
  const float* got = static_cast<const float*>(last->host_address());
  ASSERT_NE(got, nullptr);
  for (int i = 0; i < 6; ++i) {
    const float first = std::tanh(x[i]) * y[i] + y[i];
    EXPECT_NEAR(got[i], std::tanh(first) * y[i] + y[i], 1e-4) << i;
  }
}

TEST(XlaExecutorTest, StoreBuffersAreReadInPlace) {
  XlaExecutor executor(Options());
  auto runtime = executor.Runtime();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  // Store buffers are 64-byte aligned (heap) or page aligned (memfd).
  alignas(64) static float data[1024] = {};
  const TensorSpec spec{DType::kF32, {32, 32}};
  for (int device = 0; device < 2; ++device) {
    auto in_place = (*runtime)->ReadsInPlace({spec, data}, device);
    ASSERT_TRUE(in_place.ok()) << in_place.status();
    EXPECT_TRUE(*in_place) << "device " << device;
  }
}

// The buffer a CUDA IPC copy from a peer is written into: allocated on the
// given device, ready once allocated, then filled by whoever made it. On
// CPU it is host memory (filled here through host_address); it is not GPU
// memory, so gpu_address says so instead of giving an address.
TEST(XlaExecutorTest, AnUninitializedBufferIsFilledByItsMaker) {
  XlaExecutor executor(Options());
  const PjrtRuntime& runtime = **executor.Runtime();
  const TensorSpec spec{DType::kF32, {4, 8}};
  auto buffer = runtime.CreateUninitialized(1, spec, "buffer 3 shard 0");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->device(), 1);
  EXPECT_EQ((*buffer)->size(), spec.byte_size());
  EXPECT_FALSE((*buffer)->in_gpu_memory());
  EXPECT_EQ((*buffer)->gpu_address().status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*buffer)->Await().ok());
  ASSERT_NE((*buffer)->host_address(), nullptr);
  std::vector<float> values(32);
  for (int i = 0; i < 32; ++i) values[i] = 0.5f * i;
  std::memcpy(const_cast<void*>((*buffer)->host_address()), values.data(),
              spec.byte_size());
  std::vector<float> back(32);
  ASSERT_TRUE((*buffer)->CopyToHost(back.data()).ok());
  EXPECT_EQ(back, values);
  // A device the client does not have is an error naming it.
  auto none = runtime.CreateUninitialized(5, spec, "buffer 3 shard 1");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("buffer 3 shard 1: no device 5"),
            std::string::npos)
      << none.status();
}

TEST(XlaExecutorTest, AnUploadedValueIsReadWhereItIsWithoutACopy) {
  // A value placed in device memory once (a GPU worker's put) is a buffer
  // of its device that every run reads as it is: the host copy may go at
  // once, and no run copies it in again.
  XlaExecutor executor(Options());
  auto exe = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const PjrtRuntime& runtime = **executor.Runtime();
  const TensorSpec m{DType::kF32, {2, 3}};
  auto x = std::make_unique<float[]>(6);
  for (int i = 0; i < 6; ++i) x[i] = 0.5f * i - 1;
  const int64_t copied_in = MemoryTraffic::host_to_device().load();
  auto placed = runtime.Upload(0, m, x.get(), "buffer 9 shard 0 put");
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(MemoryTraffic::host_to_device().load() - copied_in, m.byte_size());
  std::vector<float> want(x.get(), x.get() + 6);
  x.reset();  // the plugin has read it
  EXPECT_EQ((*placed)->device(), 0);
  std::vector<float> back(6);
  ASSERT_TRUE((*placed)->CopyToHost(back.data()).ok());
  EXPECT_EQ(back, want);
  alignas(64) float y[6] = {1, 0, 1, 0, 1, 0};
  for (int run = 0; run < 3; ++run) {
    PjrtRuntime::ArgumentReads reads;
    absl::Notification done;
    auto out = runtime.Execute(
        **exe, {{XlaArgument{m, nullptr, placed->get()}, {m, y}}},
        "test program", [&](absl::Status s) { done.Notify(); }, &reads);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    EXPECT_EQ(reads[0][0], ArgumentRead::kAlias) << run;
  }
  EXPECT_EQ(MemoryTraffic::host_to_device().load() - copied_in, m.byte_size());
  // A device the client does not have is an error naming the value.
  auto none = runtime.Upload(5, m, want.data(), "buffer 9 shard 1 put");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("buffer 9 shard 1 put: no device 5"),
            std::string::npos)
      << none.status();
}

TEST(XlaExecutorTest, BadModulesAndShapesAreErrors) {
  XlaExecutor executor(Options());
  auto bad = executor.GetOrCompile("module { this is not mlir }", kOneDevice);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("XLA compile"), std::string::npos)
      << bad.status();
  // A failed compile is cached too: the second request fails the same way.
  auto bad2 = executor.GetOrCompile("module { this is not mlir }", kOneDevice);
  EXPECT_EQ(bad.status(), bad2.status());
  EXPECT_EQ(executor.compiles(), 1);

  auto exe = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const PjrtRuntime* runtime = *executor.Runtime();
  alignas(64) float x[4] = {};
  const TensorSpec wrong{DType::kF32, {4}};
  bool done_called = false;
  auto s = runtime->Execute(**exe, {{{wrong, x}, {wrong, x}}}, "test program",
                            [&](absl::Status) { done_called = true; });
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(done_called);  // an error at once: never queued
}

TEST(XlaExecutorTest, OnlyADonatedDeviceArgumentIsWrittenOver) {
  // The module aliases x to its output. Before arguments were marked
  // non-donatable by default, the plugin wrote over every such argument:
  // a value the store still held, and host memory read in place.
  XlaExecutor executor(Options());
  auto exe = executor.GetOrCompile(testing::kDonatingModule, kOneDevice);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const PjrtRuntime& runtime = **executor.Runtime();
  const TensorSpec v{DType::kF32, {256}};
  alignas(64) static float x[256], y[256];
  for (int i = 0; i < 256; ++i) x[i] = static_cast<float>(i), y[i] = 1;
  auto read = [](const PjrtBuffer& b, int i) {
    EXPECT_TRUE(b.Await().ok());
    return static_cast<const float*>(b.host_address())[i];
  };

  // Host memory read in place, donated or not, is never written.
  XlaArgument host_x{v, x};
  host_x.donate = true;
  auto first = RunToEnd(runtime, **exe, {{host_x, {v, y}}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(x[3], 3.0f);
  std::shared_ptr<PjrtBuffer> a = (*first)[0][0];
  EXPECT_EQ(read(*a, 3), 7.0f);

  // A device value not donated stays as it was; the output is new memory.
  auto second = RunToEnd(runtime, **exe, {{{v, nullptr, a.get()}, {v, y}}});
  ASSERT_TRUE(second.ok()) << second.status();
  std::shared_ptr<PjrtBuffer> b = (*second)[0][0];
  EXPECT_FALSE(a->donated());
  EXPECT_EQ(read(*a, 3), 7.0f);
  EXPECT_EQ(read(*b, 3), 15.0f);
  EXPECT_NE(a->host_address(), b->host_address());

  // Donated: the output is written over it, and it holds no value.
  const void* b_memory = b->host_address();
  XlaArgument give_b{v, nullptr, b.get()};
  give_b.donate = true;
  auto third = RunToEnd(runtime, **exe, {{give_b, {v, y}}});
  ASSERT_TRUE(third.ok()) << third.status();
  std::shared_ptr<PjrtBuffer> c = (*third)[0][0];
  EXPECT_TRUE(b->donated());
  EXPECT_EQ(read(*c, 3), 31.0f);
  EXPECT_EQ(c->host_address(), b_memory);

  // On another device it is copied there, not given away.
  const std::string on_device_1 = testing::OptionsOnDevice(1);
  auto exe1 = executor.GetOrCompile(testing::kDonatingModule, on_device_1);
  ASSERT_TRUE(exe1.ok()) << exe1.status();
  XlaArgument give_c{v, nullptr, c.get()};
  give_c.donate = true;
  auto fourth = RunToEnd(runtime, **exe1, {{give_c, {v, y}}});
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_FALSE(c->donated());
  EXPECT_EQ(read(*c, 3), 31.0f);
  EXPECT_EQ(read(*(*fourth)[0][0], 3), 63.0f);
}

TEST(XlaExecutorTest, MissingPluginIsAClearErrorEveryTime) {
  PjrtOptions o;
  o.plugin_path = "/nonexistent/pjrt_plugin.so";
  XlaExecutor executor(o);
  auto exe = executor.GetOrCompile(kTanhModule, kOneDevice);
  ASSERT_FALSE(exe.ok());
  EXPECT_NE(exe.status().message().find("/nonexistent/pjrt_plugin.so"),
            std::string::npos)
      << exe.status();
  EXPECT_FALSE(executor.Runtime().ok());
}

}  // namespace
}  // namespace plexus::xla
