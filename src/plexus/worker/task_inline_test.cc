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
// publishes the output, then ends its turn, a few instructions later):
// looked for until a deadline.
void AwaitIdle(WorkerImpl& worker) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (worker.pending_tasks() > 0 && absl::Now() < give_up) {
    std::this_thread::yield();
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
// there), advancing the clock while it runs if it sleeps (`micros` > 0;
// a quick one is never timed across an advance), and waits for the
// device to be idle.
void RunOnce(FakeClock& clock, WorkerImpl& worker, uint64_t program,
             int64_t micros, uint64_t input, uint64_t output) {
  proto::ServerToWorker msg;
  Call(msg, program, input, output);
  worker.ApplyOps(msg);
  if (micros > 0) AdvanceUntilReady(clock, worker, output);
  Read(worker, output);
  AwaitIdle(worker);
}

// A worker with one program loaded (device_sleep of `micros`), a put x
// of {from, from + 1, ...}, and the program's first call on x made
// `first` (timed on the device thread).
class TaskInlineTest : public ::testing::Test {
 protected:
  void Start(int64_t micros, int64_t memory = 1 << 20, float from = 1.0f) {
    worker_ = LocalWorker(&clock_, memory);
    proto::ServerToWorker msg;
    msg.set_worker_id(1);
    Load(msg, program_, micros);
    Declare(msg, x_);
    worker_->ApplyOps(msg);
    Deliver(*worker_, x_, from);
    RunOnce(clock_, *worker_, program_, micros, x_, first_);
  }
  // Applies one message of ops, as `fill` writes it.
  template <typename Fill>
  void Apply(Fill fill) {
    proto::ServerToWorker msg;
    fill(msg);
    worker_->ApplyOps(msg);
  }

  FakeClock clock_;
  std::unique_ptr<WorkerImpl> worker_;
  const uint64_t program_ = Id(1), x_ = Id(2), first_ = Id(3);
};

TEST_F(TaskInlineTest, AQuickProgramsNextCallRunsOnTheReader) {
  Start(/*micros=*/0);
  EXPECT_EQ(worker_->tasks_inline(), 0) << "its first task is never inline";
  const uint64_t second = Id(4);
  Apply([&](auto& msg) { Call(msg, program_, first_, second); });
  EXPECT_EQ(worker_->tasks_inline(), 1);
  EXPECT_EQ(worker_->pending_tasks(), 0) << "it ran before ApplyOps returned";
  EXPECT_EQ(Read(*worker_, second), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(TaskInlineTest, ASlowProgramStaysOnItsDeviceThread) {
  // 20 ms of the clock: far over TaskRunner::kInlineTask.
  Start(/*micros=*/20000, 1 << 20, 5.0f);
  const uint64_t second = Id(4);
  Apply([&](auto& msg) { Call(msg, program_, first_, second); });
  EXPECT_EQ(worker_->tasks_inline(), 0);
  AdvanceUntilReady(clock_, *worker_, second);
  EXPECT_EQ(Read(*worker_, second), (std::vector<float>{5, 6, 7, 8}));
}

TEST_F(TaskInlineTest, ACallWhoseInputIsNotReadyIsQueuedNotWaitedFor) {
  Start(/*micros=*/0);
  const uint64_t late = Id(4), second = Id(5);
  Apply([&](auto& msg) { Declare(msg, late); });  // its bytes come later
  proto::ServerToWorker msg;
  Call(msg, program_, late, second);
  EXPECT_TRUE(AppliedWithoutWaiting(*worker_, msg, [&] {
    Deliver(*worker_, late, 10.0f);
  })) << "the reader waited for the call's input";
  EXPECT_EQ(Read(*worker_, second), (std::vector<float>{10, 11, 12, 13}));
  EXPECT_EQ(worker_->tasks_inline(), 0);
}

TEST_F(TaskInlineTest, ACallWithNoRoomForItsOutputIsQueuedNotWaitedFor) {
  // 4 KiB of device memory: x and first (32 bytes), and a put that takes
  // all the rest.
  Start(/*micros=*/0, /*memory=*/4096);
  const uint64_t big = Id(4), second = Id(5);
  const int64_t rest = (4096 - 32) / sizeof(float);
  Apply([&](auto& msg) { Declare(msg, big, rest); });
  Deliver(*worker_, big, 0.0f, rest);

  proto::ServerToWorker msg;
  Call(msg, program_, first_, second);
  // The queued task gets its room once the put goes (released here as
  // the reader would, had it not been held).
  EXPECT_TRUE(AppliedWithoutWaiting(*worker_, msg, [&] {
    Apply(
        [&](auto& m) { m.add_ops()->mutable_release()->add_buffer_ids(big); });
  })) << "the reader waited for room";
  EXPECT_EQ(Read(*worker_, second), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(worker_->tasks_inline(), 0);
}

TEST_F(TaskInlineTest, ACallOnABusyDeviceWaitsItsTurn) {
  Start(/*micros=*/0);
  const uint64_t slow = Id(4), held = Id(5), second = Id(6);
  // The slow call holds the device (until the test advances the clock);
  // the quick one comes behind it.
  Apply([&](auto& msg) {
    Load(msg, slow, 20000);
    Call(msg, slow, x_, held);
    Call(msg, program_, first_, second);
  });
  EXPECT_EQ(worker_->tasks_inline(), 0);
  AdvanceUntilReady(clock_, *worker_, held);
  EXPECT_EQ(Read(*worker_, held), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(Read(*worker_, second), (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace plexus
