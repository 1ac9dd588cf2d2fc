// A quick task runs on the reader that applies its call (TaskRunner::
// TryRunInline), and nothing that could hold the reader does: a program
// not yet run or slow, an input not ready, no room for its memory, a busy
// device. Each case checks the worker's count of inline tasks and the
// value the call made.
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plexus/common/clock.h"
#include "plexus/store/object_store.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

constexpr uint64_t kClient = 1;
uint64_t Id(uint64_t n) { return ClientMadeId(kClient, n); }

void F32(proto::TensorSpec* spec, int64_t n) {
  spec->set_dtype(proto::F32);
  spec->add_shape(n);
}

// On a clock of the test's: a task takes no time unless the test
// advances the clock while it runs, so a program is quick or slow by the
// test's say, not by the machine's load.
std::unique_ptr<WorkerImpl> LocalWorker(FakeClock* clock,
                                        int64_t memory = 1 << 20) {
  WorkerOptions options;
  options.num_devices = 1;
  options.device_memory = memory;
  options.clock = clock;
  auto worker = std::make_unique<WorkerImpl>(options);
  EXPECT_TRUE(worker->StartLocal().ok());
  return worker;
}

// device_sleep copies its f32[4] argument after `micros` of the clock.
void Load(proto::ServerToWorker& msg, uint64_t program, int64_t micros) {
  auto* load = msg.add_ops()->mutable_load();
  load->set_program_id(program);
  load->mutable_program()->set_name(micros == 0 ? "quick" : "slow");
  load->mutable_program()->set_kernel("device_sleep");
  (*load->mutable_program()->mutable_attrs())["micros"].set_i(micros);
  F32(load->mutable_program()->add_inputs()->mutable_global(), 4);
  F32(load->mutable_program()->add_outputs()->mutable_global(), 4);
}

void Declare(proto::ServerToWorker& msg, uint64_t id, int64_t n = 4) {
  auto* decl = msg.add_ops()->mutable_declare();
  decl->set_buffer_id(id);
  decl->set_device(0);
  F32(decl->mutable_spec(), n);
}

void Call(proto::ServerToWorker& msg, uint64_t program, uint64_t input,
          uint64_t output) {
  auto* exec = msg.add_ops()->mutable_execute();
  exec->set_call_id(output);
  exec->set_program_id(program);
  exec->set_num_shards(1);
  exec->set_client_id(kClient);
  exec->add_output_ids(output);
  auto* task = exec->add_tasks();
  task->set_device(0);
  auto* binding = task->add_inputs();
  F32(binding->mutable_local(), 4);
  auto* piece = binding->add_pieces();
  piece->set_buffer_id(input);
  piece->set_length(4);
}

// A client's put of `n` floats counting up from `first`.
void Deliver(WorkerImpl& worker, uint64_t id, float first, int64_t n = 4) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  ASSERT_TRUE(worker.data_plane().AdmitIncoming({id, 0}, bytes, true).ok());
  absl::StatusOr<std::shared_ptr<Storage>> data = Storage::Allocate(bytes);
  ASSERT_TRUE(data.ok());
  for (int64_t i = 0; i < n; ++i) {
    const float v = first + static_cast<float>(i);
    std::memcpy(static_cast<char*>((*data)->data()) + i * sizeof(float), &v,
                sizeof(float));
  }
  ASSERT_TRUE(worker.data_plane().Deliver({id, 0}, *data, true).ok());
}

// The output's four floats, once ready.
std::vector<float> Read(WorkerImpl& worker, uint64_t id) {
  auto data = worker.data_plane().AwaitReady({id, 0});
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return {};
  std::vector<float> out(4);
  std::memcpy(out.data(), (*data)->data(), sizeof(float) * 4);
  return out;
}

// Applies `msg` on another thread: whether it returned within a minute
// (a reader held by a task that waits would not), then `unblock` (what
// the task would wait for), then the thread is joined.
bool AppliedWithoutWaiting(WorkerImpl& worker, proto::ServerToWorker& msg,
                           const std::function<void()>& unblock) {
  absl::Notification applied;
  std::thread reader([&] {
    worker.ApplyOps(msg);
    applied.Notify();
  });
  const bool returned =
      applied.WaitForNotificationWithTimeout(absl::Minutes(1));
  unblock();
  reader.join();
  return returned;
}

// The device thread has let go of the task that made the last output (it
// publishes the output, then ends its turn): bounded by the count of looks.
void AwaitIdle(WorkerImpl& worker) {
  for (int i = 0; i < 30000 && worker.pending_tasks() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(worker.pending_tasks(), 0);
}

// Advances `clock` by 20 ms at a time until `id` is ready: a device_sleep
// task sleeping on it ends (bounded by the count of steps).
void AdvanceUntilReady(FakeClock& clock, WorkerImpl& worker, uint64_t id) {
  absl::Notification ready;
  std::thread reader([&] {
    worker.data_plane().AwaitReady({id, 0}).IgnoreError();
    ready.Notify();
  });
  for (int i = 0; i < 10000 && !ready.HasBeenNotified(); ++i) {
    clock.Advance(absl::Milliseconds(20));
    ready.WaitForNotificationWithTimeout(absl::Milliseconds(1));
  }
  reader.join();
}

// Runs `program` once on the device thread (its first task is timed
// there; a device_sleep's as long as the clock is advanced) and waits for
// the device to be idle.
void RunOnce(FakeClock& clock, WorkerImpl& worker, uint64_t program,
             uint64_t input, uint64_t output) {
  proto::ServerToWorker msg;
  Call(msg, program, input, output);
  worker.ApplyOps(msg);
  AdvanceUntilReady(clock, worker, output);
  Read(worker, output);
  AwaitIdle(worker);
}

TEST(TaskInlineTest, AQuickProgramsNextCallRunsOnTheReader) {
  FakeClock clock;
  std::unique_ptr<WorkerImpl> worker = LocalWorker(&clock);
  const uint64_t quick = Id(1), x = Id(2), first = Id(3), second = Id(4);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  Load(msg, quick, 0);
  Declare(msg, x);
  worker->ApplyOps(msg);
  Deliver(*worker, x, 1.0f);

  RunOnce(clock, *worker, quick, x, first);
  EXPECT_EQ(worker->tasks_inline(), 0) << "its first task is never inline";

  msg.Clear();
  Call(msg, quick, first, second);
  worker->ApplyOps(msg);
  EXPECT_EQ(worker->tasks_inline(), 1);
  EXPECT_EQ(worker->pending_tasks(), 0) << "it ran before ApplyOps returned";
  EXPECT_EQ(Read(*worker, second), (std::vector<float>{1, 2, 3, 4}));
}

TEST(TaskInlineTest, ASlowProgramStaysOnItsDeviceThread) {
  FakeClock clock;
  std::unique_ptr<WorkerImpl> worker = LocalWorker(&clock);
  const uint64_t slow = Id(1), x = Id(2), first = Id(3), second = Id(4);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  // 20 ms of the clock: far over TaskRunner::kInlineTask.
  Load(msg, slow, 20000);
  Declare(msg, x);
  worker->ApplyOps(msg);
  Deliver(*worker, x, 5.0f);

  RunOnce(clock, *worker, slow, x, first);
  msg.Clear();
  Call(msg, slow, first, second);
  worker->ApplyOps(msg);
  EXPECT_EQ(worker->tasks_inline(), 0);
  AdvanceUntilReady(clock, *worker, second);
  EXPECT_EQ(Read(*worker, second), (std::vector<float>{5, 6, 7, 8}));
}

TEST(TaskInlineTest, ACallWhoseInputIsNotReadyIsQueuedNotWaitedFor) {
  FakeClock clock;
  std::unique_ptr<WorkerImpl> worker = LocalWorker(&clock);
  const uint64_t quick = Id(1), x = Id(2), first = Id(3);
  const uint64_t late = Id(4), second = Id(5);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  Load(msg, quick, 0);
  Declare(msg, x);
  Declare(msg, late);  // its bytes come after the call
  worker->ApplyOps(msg);
  Deliver(*worker, x, 1.0f);
  RunOnce(clock, *worker, quick, x, first);

  msg.Clear();
  Call(msg, quick, late, second);
  EXPECT_TRUE(AppliedWithoutWaiting(*worker, msg, [&] {
    Deliver(*worker, late, 10.0f);
  })) << "the reader waited for the call's input";
  EXPECT_EQ(Read(*worker, second), (std::vector<float>{10, 11, 12, 13}));
  EXPECT_EQ(worker->tasks_inline(), 0);
}

TEST(TaskInlineTest, ACallWithNoRoomForItsOutputIsQueuedNotWaitedFor) {
  // 4 KiB of device memory: the quick program's f32[4] values, and a put
  // that takes all the rest.
  FakeClock clock;
  std::unique_ptr<WorkerImpl> worker = LocalWorker(&clock, 4096);
  const uint64_t quick = Id(1), x = Id(2), first = Id(3);
  const uint64_t big = Id(4), second = Id(5);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  Load(msg, quick, 0);
  Declare(msg, x);
  worker->ApplyOps(msg);
  Deliver(*worker, x, 1.0f);
  RunOnce(clock, *worker, quick, x, first);  // x and first: 32 bytes
  msg.Clear();
  const int64_t rest = (4096 - 32) / sizeof(float);
  Declare(msg, big, rest);
  worker->ApplyOps(msg);
  Deliver(*worker, big, 0.0f, rest);

  msg.Clear();
  Call(msg, quick, first, second);
  // The queued task gets its room once the put goes (released here as
  // the reader would, had it not been held).
  EXPECT_TRUE(AppliedWithoutWaiting(*worker, msg, [&] {
    proto::ServerToWorker release;
    release.add_ops()->mutable_release()->add_buffer_ids(big);
    worker->ApplyOps(release);
  })) << "the reader waited for room";
  EXPECT_EQ(Read(*worker, second), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(worker->tasks_inline(), 0);
}

TEST(TaskInlineTest, ACallOnABusyDeviceWaitsItsTurn) {
  FakeClock clock;
  std::unique_ptr<WorkerImpl> worker = LocalWorker(&clock);
  const uint64_t quick = Id(1), slow = Id(2), x = Id(3), first = Id(4);
  const uint64_t held = Id(5), second = Id(6);
  proto::ServerToWorker msg;
  msg.set_worker_id(1);
  Load(msg, quick, 0);
  Load(msg, slow, 20000);  // held until the test advances the clock
  Declare(msg, x);
  worker->ApplyOps(msg);
  Deliver(*worker, x, 1.0f);
  RunOnce(clock, *worker, quick, x, first);

  // The slow call holds the device; the quick one comes behind it.
  msg.Clear();
  Call(msg, slow, x, held);
  Call(msg, quick, first, second);
  worker->ApplyOps(msg);
  EXPECT_EQ(worker->tasks_inline(), 0);
  AdvanceUntilReady(clock, *worker, held);
  EXPECT_EQ(Read(*worker, held), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Read(*worker, second), (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace plexus
