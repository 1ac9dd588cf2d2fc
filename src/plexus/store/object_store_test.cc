#include "plexus/store/object_store.h"

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/common/status_proto.h"

namespace plexus {
namespace {

ObjectStore::Options TwoDevices(int64_t budget) {
  ObjectStore::Options o;
  o.device_memory = {budget, budget};
  o.reserve_timeout = absl::Seconds(5);
  o.unknown_key_timeout = absl::Milliseconds(50);
  return o;
}

std::shared_ptr<Storage> Bytes(size_t n) { return *Storage::Allocate(n); }

// A ready value in a device's memory (the store only holds it).
class HeldDeviceBuffer : public DeviceBuffer {
 public:
  explicit HeldDeviceBuffer(size_t n) : bytes_(n) {}
  size_t size() const override { return bytes_.size(); }
  absl::Status Await() const override { return absl::OkStatus(); }
  const void* host_address() const override { return nullptr; }
  absl::Status CopyToHost(void*) const override { return absl::OkStatus(); }

 private:
  std::vector<char> bytes_;
};

TEST(ObjectStoreTest, OwnedShardLivesUntilReleased) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{7, 0};
  store.Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
  ASSERT_TRUE(store.Reserve(0, 16).ok());
  store.Fulfil(key, Bytes(16), 0);
  EXPECT_EQ(store.Stats().live_shards, 1);
  EXPECT_EQ(store.Stats().device_bytes[0], 16);
  store.Release(7);
  EXPECT_EQ(store.Stats().live_shards, 0);
  EXPECT_EQ(store.Stats().device_bytes[0], 0);
}

// A task's outputs, inputs and an op's releases go through the store under
// one lock each (DeclareOutputs, AddReaders, Fulfil of a span, Release of a
// span): each value as it would alone.
TEST(ObjectStoreTest, ATasksValuesGoThroughTheStoreAsEachWouldAlone) {
  ObjectStore store(TwoDevices(1 << 20));
  const std::vector<BufferKey> outs = {{1, 0}, {2, 0}, {3, 0}};
  const TensorSpec spec{DType::kF32, {4}};
  store.DeclareOutputs(outs, 0, {spec, spec, spec});
  EXPECT_EQ(store.Stats().live_shards, 3);

  // Pinned in order until one is unknown here.
  bool elsewhere = true;
  int pinned = -1;
  absl::Status known =
      store.AddReaders({{1, 0}, {99, 0}, {3, 0}}, 0, &elsewhere, &pinned);
  EXPECT_EQ(known.code(), absl::StatusCode::kNotFound) << known;
  EXPECT_TRUE(absl::StrContains(known.message(), "99")) << known;
  EXPECT_EQ(pinned, 1);
  EXPECT_FALSE(elsewhere);  // computed here, on this device
  store.RemoveReaders({{1, 0}});

  // Published together: waiters and callbacks hear each value.
  std::atomic<int> heard{0};
  store.OnReady({2, 0}, [&](absl::StatusOr<std::shared_ptr<const Storage>> s) {
    if (s.ok() && (*s)->size() == 16) heard++;
  });
  std::vector<ObjectStore::Output> ready;
  for (const BufferKey& key : outs) {
    ready.push_back({key, Bytes(16), /*reserved=*/false});
  }
  store.Fulfil(absl::MakeSpan(ready), 0);
  EXPECT_EQ(heard.load(), 1);
  EXPECT_EQ(store.Stats().device_bytes[0], 48);

  // A put still waiting for its bytes, released with the rest, fails and
  // says why; everything released is freed.
  const BufferKey put{4, 0};
  store.Declare(put, 0, spec, /*owned=*/true,
                ObjectStore::Arrival::kFromClient);
  absl::Status put_end;
  store.OnReady(put, [&](absl::StatusOr<std::shared_ptr<const Storage>> s) {
    put_end = s.status();
  });
  const std::vector<uint64_t> ids = {1, 2, 3, 4};
  store.Release(absl::MakeConstSpan(ids));
  EXPECT_EQ(put_end.code(), absl::StatusCode::kCancelled) << put_end;
  EXPECT_TRUE(absl::StrContains(put_end.message(),
                                "buffer 4 was released before its put arrived"))
      << put_end;
  EXPECT_EQ(store.Stats().live_shards, 0);
  EXPECT_EQ(store.Stats().device_bytes[0], 0);
}

TEST(ObjectStoreTest, ReaderKeepsReleasedShardAlive) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{7, 1};
  store.Declare(key, 1, {DType::kF32, {4}}, true);
  ASSERT_TRUE(store.AddReader(key).ok());
  store.Fulfil(key, Bytes(16), 1, /*reserved=*/false);
  store.Release(7);
  EXPECT_EQ(store.Stats().live_shards, 1);
  store.RemoveReader(key);
  EXPECT_EQ(store.Stats().live_shards, 0);
}

TEST(ObjectStoreTest, DataBeforeDeclarationIsKept) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{9, 0};
  store.Fulfil(key, Bytes(8), 0, false);
  EXPECT_EQ(store.Stats().live_shards, 1);
  store.Declare(key, 0, {DType::kI32, {2}}, /*owned=*/false);
  EXPECT_EQ(store.Stats().live_shards, 1);  // its reader is not queued yet
  ASSERT_TRUE(store.AddReader(key).ok());
  store.RemoveReader(key);
  EXPECT_EQ(store.Stats().live_shards, 0);  // read once: gone
}

TEST(ObjectStoreTest, DataBeforeDeclarationIsChargedWhenDeclared) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{11, 0};
  store.Fulfil(key, Bytes(64), /*device=*/-1, /*reserved=*/false);
  EXPECT_EQ(store.Stats().device_bytes[1], 0);
  store.Declare(key, 1, {DType::kF32, {16}}, /*owned=*/true);
  EXPECT_EQ(store.Stats().device_bytes[1], 64);
  store.Release(11);
  EXPECT_EQ(store.Stats().device_bytes[1], 0);
}

TEST(ObjectStoreTest, AwaitReadyWakesWhenAnotherThreadFulfils) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{3, 0};
  store.Declare(key, 0, {DType::kF32, {1}}, true);
  std::thread producer([&] { store.Fulfil(key, Bytes(4), 0, false); });
  auto got = store.AwaitReady(key);
  producer.join();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->size(), 4u);
}

// Until AwaitedInputs counts `n` waits (a bounded wait for the waiting
// threads to block): the list, oldest first.
std::vector<AwaitedInput> AwaitListed(const ObjectStore& store, int n,
                                      int max = 8) {
  std::vector<AwaitedInput> listed;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (store.AwaitedInputs(max, &listed) != n && absl::Now() < deadline) {
    std::this_thread::yield();
  }
  return listed;
}

// The heartbeat names the inputs tasks wait for, the peer each comes from
// and since when (WorkerStats.awaiting_inputs): only while a wait blocks.
TEST(ObjectStoreTest, AwaitInputIsListedWhileItBlocks) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey ready{7, 0}, from_peer{8, 0}, computed{9, 1};
  store.Declare(ready, 0, {DType::kF32, {1}}, true);
  store.Fulfil(ready, Bytes(4), 0, false);
  ASSERT_TRUE(store.AwaitInput(ready).ok());
  std::vector<AwaitedInput> listed;
  EXPECT_EQ(store.AwaitedInputs(8, &listed), 0);  // it did not block
  store.Declare(from_peer, 0, {DType::kF32, {1}}, false,
                ObjectStore::Arrival::kFromPeer, /*source_worker=*/2);
  store.Declare(computed, 1, {DType::kF32, {1}}, true);
  std::thread a([&] { EXPECT_TRUE(store.AwaitInput(from_peer).ok()); });
  listed = AwaitListed(store, 1);
  std::thread b([&] { EXPECT_TRUE(store.AwaitInput(computed).ok()); });
  listed = AwaitListed(store, 2);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, from_peer);  // the oldest first
  EXPECT_EQ(listed[0].source_worker, 2);
  EXPECT_EQ(listed[1].key, computed);
  EXPECT_EQ(listed[1].source_worker, -1);  // made here
  EXPECT_LE(listed[0].since, listed[1].since);
  EXPECT_EQ(store.AwaitedInputs(1, &listed), 2);  // bounded: the oldest
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, from_peer);
  store.Fulfil(from_peer, Bytes(4), 0, false);
  a.join();
  listed = AwaitListed(store, 1);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, computed);
  store.Fulfil(computed, Bytes(4), 1, false);
  b.join();
  EXPECT_EQ(store.AwaitedInputs(8, &listed), 0);
  EXPECT_TRUE(listed.empty());
}

TEST(ObjectStoreTest, FailureReachesWaitersAndCallbacks) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{4, 0};
  store.Declare(key, 0, {DType::kF32, {1}}, true,
                ObjectStore::Arrival::kFromPeer, /*source_worker=*/2);
  absl::Status seen;
  store.OnReady(key, [&](auto r) { seen = r.status(); });
  store.FailFromSource(2, absl::UnavailableError("worker 2 died"));
  EXPECT_EQ(seen.message(), "worker 2 died");
  EXPECT_EQ(store.AwaitReady(key).status().message(), "worker 2 died");
}

// A collective declares its peers' partials when its task runs, which may
// be long after a peer was declared down: such a declaration used to wait
// for good (a fetch of the all_reduce hung).
TEST(ObjectStoreTest, DataExpectedFromAWorkerAlreadyDownFailsAtOnce) {
  ObjectStore store(TwoDevices(1 << 20));
  store.FailFromSource(2, absl::UnavailableError("worker 2 died"));
  BufferKey late{5, 1};
  store.Declare(late, 0, {DType::kF32, {1}}, false,
                ObjectStore::Arrival::kFromPeer, /*source_worker=*/2);
  auto got = store.AwaitReady(late);  // returns: no hang
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(got.status().message(), "worker 2 died");
  // Data from other sources still waits for them.
  BufferKey other{6, 0};
  store.Declare(other, 0, {DType::kF32, {1}}, false,
                ObjectStore::Arrival::kFromPeer, /*source_worker=*/3);
  bool completed = false;
  store.OnReady(other, [&](auto) { completed = true; });
  EXPECT_FALSE(completed);
  store.FailFromSource(3, absl::UnavailableError("worker 3 died"));
  EXPECT_TRUE(completed);
}

TEST(ObjectStoreTest, UnknownKeyTimesOutWithNotFound) {
  ObjectStore store(TwoDevices(1 << 20));
  auto got = store.AwaitReady({99, 0});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
}

// A device buffer that, as it is freed, asks whether another thread can
// take the store's lock meanwhile (it asks the store something, and waits
// for the answer up to 30 s).
class LockProbingBuffer : public HeldDeviceBuffer {
 public:
  LockProbingBuffer(ObjectStore* store, std::thread* asker, bool* lock_free)
      : HeldDeviceBuffer(16),
        store_(store),
        asker_(asker),
        lock_free_(lock_free) {}
  ~LockProbingBuffer() override {
    auto answered = std::make_shared<absl::Notification>();
    *asker_ = std::thread([store = store_, answered] {
      store->HasLeft(1);
      answered->Notify();
    });
    *lock_free_ = answered->WaitForNotificationWithTimeout(absl::Seconds(30));
  }

 private:
  ObjectStore* store_;
  std::thread* asker_;
  bool* lock_free_;
};

// Freeing a device buffer calls into its runtime (PJRT_Buffer_Destroy):
// a release frees what it removes with the store's lock let go, so the
// device thread's uses of the store do not wait behind it. It held the
// lock through every free before.
TEST(ObjectStoreTest, AReleaseFreesItsValuesWithTheStoresLockLetGo) {
  ObjectStore store(TwoDevices(1 << 20));
  std::thread asker;
  bool lock_free = false;
  BufferKey key{1, 0};
  store.Declare(key, 0, {DType::kF32, {4}}, true);
  ASSERT_TRUE(store.Reserve(0, 16).ok());
  store.Fulfil(key,
               Storage::OnDevice(std::make_shared<LockProbingBuffer>(
                   &store, &asker, &lock_free)),
               0);
  store.Release(1);
  ASSERT_TRUE(asker.joinable());  // the buffer was freed by the release
  asker.join();
  EXPECT_TRUE(lock_free);
  EXPECT_EQ(store.Stats().live_shards, 0);
  EXPECT_EQ(store.Stats().device_bytes[0], 0);
}

TEST(ObjectStoreTest, ReserveBlocksUntilMemoryIsFreed) {
  ObjectStore store(TwoDevices(100));
  BufferKey key{1, 0};
  store.Declare(key, 0, {DType::kF32, {20}}, true);
  ASSERT_TRUE(store.Reserve(0, 80).ok());
  store.Fulfil(key, Bytes(80), 0);
  std::thread releaser([&] { store.Release(1); });
  EXPECT_TRUE(store.Reserve(0, 80).ok());  // waits for the release
  releaser.join();
}

TEST(ObjectStoreTest, AReservationWaitingForRoomIsCountedWhileItWaits) {
  ObjectStore store(TwoDevices(100));
  BufferKey key{1, 0};
  store.Declare(key, 0, {DType::kF32, {20}}, true);
  ASSERT_TRUE(store.Reserve(0, 80).ok());
  store.Fulfil(key, Bytes(80), 0);
  EXPECT_EQ(store.Stats().device_waiting_bytes, (std::vector<int64_t>{0, 0}));
  std::thread waiter([&] { EXPECT_TRUE(store.Reserve(0, 60).ok()); });
  // The waiter shows once it waits (bounded: it needs no more than its
  // thread's start).
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (store.Stats().device_waiting_bytes[0] != 60 && absl::Now() < give_up) {
    std::this_thread::yield();
  }
  EXPECT_EQ(store.Stats().device_waiting_bytes, (std::vector<int64_t>{60, 0}));
  store.Release(1);
  waiter.join();
  EXPECT_EQ(store.Stats().device_waiting_bytes, (std::vector<int64_t>{0, 0}));
}

// A task run on the reader reserves its memory ahead, never waiting
// (TaskRunner::TryRunInline): refused when it does not fit, and when
// another reservation waits for room (it would pass it).
TEST(ObjectStoreTest, TryReserveNeverWaitsNorPassesAWaitingReservation) {
  ObjectStore store(TwoDevices(100));
  EXPECT_TRUE(store.TryReserve(0, 80));
  EXPECT_FALSE(store.TryReserve(0, 30));
  EXPECT_TRUE(store.TryReserve(1, 30));  // another device's budget
  EXPECT_EQ(store.Stats().device_bytes, (std::vector<int64_t>{80, 30}));

  std::thread waiter([&] { EXPECT_TRUE(store.Reserve(0, 60).ok()); });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (store.Stats().device_waiting_bytes[0] != 60 && absl::Now() < give_up) {
    std::this_thread::yield();
  }
  ASSERT_EQ(store.Stats().device_waiting_bytes[0], 60);
  EXPECT_FALSE(store.TryReserve(0, 10)) << "it fits, but 60 bytes wait";
  store.Unreserve(0, 80);
  waiter.join();
  EXPECT_TRUE(store.TryReserve(0, 10));
  EXPECT_EQ(store.Stats().device_bytes, (std::vector<int64_t>{70, 30}));
}

// What a task charges draws on what it reserved ahead, then on the budget.
TEST(ObjectStoreTest, ReserveDrawsOnTheBytesReservedAhead) {
  ObjectStore store(TwoDevices(100));
  ASSERT_TRUE(store.TryReserve(0, 40));
  int64_t ahead = 40;
  EXPECT_TRUE(store.Reserve(0, 16, &ahead).ok());
  EXPECT_EQ(ahead, 24);
  auto storage = store.Allocate(0, 24, &ahead);
  ASSERT_TRUE(storage.ok());
  EXPECT_EQ(ahead, 0);
  EXPECT_EQ(store.Stats().device_bytes[0], 40) << "nothing charged twice";
  EXPECT_TRUE(store.Reserve(0, 8, &ahead).ok());  // beyond it: the budget's
  EXPECT_EQ(ahead, 0);
  EXPECT_EQ(store.Stats().device_bytes[0], 48);
}

TEST(ObjectStoreTest, AllReadyIsWhetherNoReadWouldWait) {
  ObjectStore store(TwoDevices(1 << 20));
  const BufferKey ready{1, 0}, failed{2, 0}, pending{3, 0}, unknown{4, 0};
  for (const BufferKey& key : {ready, failed, pending}) {
    store.Declare(key, 0, {DType::kF32, {4}}, true);
  }
  ASSERT_TRUE(store.Reserve(0, 16).ok());
  store.Fulfil(ready, Bytes(16), 0);
  store.Fail(failed, absl::InternalError("upstream"));
  EXPECT_TRUE(store.AllReady({ready, failed}));
  EXPECT_TRUE(store.AllReady({}));
  EXPECT_FALSE(store.AllReady({ready, pending}));
  EXPECT_FALSE(store.AllReady({unknown}));
}

TEST(ObjectStoreTest, ShardLargerThanBudgetFailsAtOnce) {
  ObjectStore store(TwoDevices(100));
  absl::Status s = store.Reserve(1, 101);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("can never fit device 1"), std::string::npos);
}

TEST(ObjectStoreTest, ReleaseClientDropsOnlyThatClientsBuffers) {
  ObjectStore store(TwoDevices(1 << 20));
  uint64_t a = ClientMadeId(uint64_t{5}, 1);
  uint64_t b = ClientMadeId(uint64_t{6}, 1);
  for (uint64_t id : {a, b}) {
    store.Declare({id, 0}, 0, {DType::kF32, {1}}, true);
    store.Fulfil({id, 0}, Bytes(4), 0, false);
  }
  store.ReleaseClient(5);
  EXPECT_EQ(store.Stats().live_shards, 1);
}

// --- incoming data, deadlines and ways out (the fake clock: no sleeping) ---

struct FakeClockStore {
  explicit FakeClockStore(int64_t budget) {
    ObjectStore::Options o;
    o.device_memory = {budget, budget};
    o.clock = &clock;
    o.reserve_timeout = absl::Seconds(30);
    o.unknown_key_timeout = absl::Seconds(30);
    store = std::make_unique<ObjectStore>(o);
  }
  FakeClock clock;
  std::unique_ptr<ObjectStore> store;
};

constexpr auto kClient = ObjectStore::Arrival::kFromClient;
constexpr auto kPeer = ObjectStore::Arrival::kFromPeer;

TEST(ObjectStoreTest, IncomingBytesMustMatchTheDeclaredSize) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{21, 0};
  store.Declare(key, 0, {DType::kF32, {4}}, true, kClient);
  absl::Status s = store.AdmitIncoming(key, 1 << 20, /*from_client=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "16 bytes")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1048576 bytes")) << s;
  // Its readers hear the same, instead of reading 16 bytes out of 1 MiB.
  EXPECT_EQ(store.AwaitReady(key).status(), s);
  EXPECT_EQ(store.Stats().device_bytes[0], 0);
}

TEST(ObjectStoreTest, AdmittedBytesAreChargedBeforeTheyArrive) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{22, 0};
  store.Declare(key, 1, {DType::kF32, {4}}, true, kClient);
  ASSERT_TRUE(store.AdmitIncoming(key, 16, true).ok());
  EXPECT_EQ(store.Stats().device_bytes[1], 16);
  // A second PUT of the same shard is refused while the first is received.
  EXPECT_EQ(store.AdmitIncoming(key, 16, true).code(),
            absl::StatusCode::kAlreadyExists);
  store.FulfilIncoming(key, Bytes(16));
  EXPECT_EQ((*store.AwaitReady(key))->size(), 16u);
  store.Release(22);
  EXPECT_EQ(store.Stats().device_bytes[1], 0);
}

TEST(ObjectStoreTest, FailedReceptionReturnsItsMemory) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{23, 0};
  store.Declare(key, 0, {DType::kF32, {4}}, true, kPeer, /*source_worker=*/1);
  ASSERT_TRUE(store.AdmitIncoming(key, 16, false).ok());
  store.Fail(key, absl::UnavailableError("connection broke"));
  EXPECT_EQ(store.Stats().device_bytes[0], 0);
  store.FulfilIncoming(key, Bytes(16));  // too late: dropped
  EXPECT_EQ(store.AwaitReady(key).status().message(), "connection broke");
}

TEST(ObjectStoreTest, AbandonedReceptionIsAdmittedAgainTheOtherWay) {
  // A peer's CUDA IPC copy could not be made here: the shard's charge
  // comes back and the bytes the peer then pushes are admitted as usual.
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{26, 0};
  store.Declare(key, 1, {DType::kF32, {4}}, true, kPeer, /*source_worker=*/1);
  ASSERT_TRUE(store.AdmitIncoming(key, 16, false).ok());
  EXPECT_EQ(store.Stats().device_bytes[1], 16);
  store.AbandonIncoming(key);
  EXPECT_EQ(store.Stats().device_bytes[1], 0);
  ASSERT_TRUE(store.AdmitIncoming(key, 16, false).ok());
  store.FulfilIncoming(key, Bytes(16));
  EXPECT_EQ((*store.AwaitReady(key))->size(), 16u);
  EXPECT_EQ(store.Stats().device_bytes[1], 16);
  store.AbandonIncoming(key);  // no longer received: nothing changes
  EXPECT_EQ(store.Stats().device_bytes[1], 16);
  EXPECT_TRUE(store.AwaitReady(key).ok());
}

TEST(ObjectStoreTest, ComputedShardsTakeNoIncomingData) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{24, 0};
  store.Declare(key, 0, {DType::kF32, {4}}, true);  // a call's output
  EXPECT_EQ(store.AdmitIncoming(key, 16, true).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store.AdmitIncoming(key, 16, false).code(),
            absl::StatusCode::kPermissionDenied);
  BufferKey put{25, 0};
  store.Declare(put, 0, {DType::kF32, {4}}, true, kClient);
  EXPECT_EQ(store.AdmitIncoming(put, 16, /*from_client=*/false).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(ObjectStoreTest, DataBeforeDeclarationInAnotherSizeFails) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{26, 0};
  store.Fulfil(key, Bytes(8), -1, false);
  store.Declare(key, 0, {DType::kF32, {64}}, true);
  absl::Status s = store.AwaitReady(key).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "256 bytes")) << s;
}

TEST(ObjectStoreTest, ReleasedInputIsNotFoundForANewReader) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{27, 0};
  store.Declare(key, 0, {DType::kF32, {1}}, true);
  store.Fulfil(key, Bytes(4), 0, false);
  store.Release(27);
  absl::Status s = store.AddReader(key);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(s.message(), "released")) << s;
  EXPECT_EQ(store.Stats().live_shards, 0);  // no pending entry left behind
}

TEST(ObjectStoreTest, UndeclaredPutWaitsForItsDeclaration) {
  FakeClockStore f(1 << 20);
  BufferKey key{28, 0};
  absl::Status admitted;
  std::thread sender([&] { admitted = f.store->AdmitIncoming(key, 16, true); });
  f.clock.AwaitWaiters(1);  // blocked on the declaration
  f.store->Declare(key, 0, {DType::kF32, {4}}, true, kClient);
  sender.join();
  EXPECT_TRUE(admitted.ok()) << admitted;
}

TEST(ObjectStoreTest, UndeclaredPutIsHeldAtMostTheDeadline) {
  FakeClockStore f(1 << 20);
  absl::Status admitted;
  std::thread sender([&] {
    admitted = f.store->AdmitIncoming({29, 0}, 16, true);
  });
  f.clock.AwaitWaiters(1);
  f.clock.Advance(absl::Seconds(31));
  sender.join();
  EXPECT_EQ(admitted.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(admitted.message(), "never declared"))
      << admitted;
  EXPECT_EQ(f.store->Stats().live_shards, 0);
}

// A FakeClock that counts the waits begun on it: each time a waiter for an
// undeclared key wakes and finds it still missing, it waits again.
class CountingClock : public Clock {
 public:
  absl::Time Now() const override { return clock.Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                         absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    waits.fetch_add(1);
    return clock.AwaitWithDeadline(mu, cv, deadline);
  }
  void SleepFor(absl::Duration d) override { clock.SleepFor(d); }
  FakeClock clock;
  std::atomic<int> waits{0};
};

// A client's fetch of a graph's last output reaches the worker before the
// graph's calls: it sleeps through their declarations, woken once by its own
// key's (it used to wake on every other key's, a futex and a context switch
// on each of the worker's reader and the fetcher per call).
TEST(ObjectStoreTest, AWaitForAnUndeclaredKeyWakesOnlyForThatKey) {
  CountingClock counting;
  ObjectStore::Options o;
  o.device_memory = {1 << 20};
  o.clock = &counting;
  o.unknown_key_timeout = absl::Seconds(30);
  ObjectStore store(o);
  const BufferKey last{4000, 0};
  absl::StatusOr<std::shared_ptr<const Storage>> got;
  std::thread fetcher([&] { got = store.AwaitReady(last); });
  counting.clock.AwaitWaiters(1);
  for (uint64_t id = 1; id <= 2000; ++id) {
    store.Declare({id, 0}, 0, {DType::kF32, {1}}, /*owned=*/false);
  }
  store.Declare(last, 0, {DType::kF32, {4}}, /*owned=*/true);
  ASSERT_TRUE(store.Reserve(0, 16).ok());
  store.Fulfil(last, Bytes(16), 0);
  fetcher.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->size(), 16u);
  EXPECT_EQ(counting.waits.load(), 1);  // one wait, ended by its own key
}

// A fetch that came before the call making its value sleeps until the
// value, not waking at its declaration: still under the unknown key's
// deadline then, which must not end it once the key is declared.
TEST(ObjectStoreTest,
     AFetchBeforeItsDeclarationOutlivesTheUnknownKeysDeadline) {
  FakeClockStore f(1 << 20);
  const BufferKey key{77, 0};
  absl::StatusOr<std::shared_ptr<const Storage>> got;
  std::thread fetcher([&] { got = f.store->AwaitReady(key); });
  f.clock.AwaitWaiters(1);
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
  // Still a waiter on the clock: the declaration did not wake it.
  f.clock.AwaitWaiters(1);
  f.clock.Advance(absl::Seconds(31));  // past the unknown key's 30 s
  ASSERT_TRUE(f.store->Reserve(0, 16).ok());
  f.store->Fulfil(key, Bytes(16), 0);
  fetcher.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->size(), 16u);
}

// A fetch's hook (AwaitReady's `on_ready`) runs on the thread that
// readies its value, before that thread's Fulfil returns, with the value;
// a hook whose wait ended otherwise is taken back and never runs.
TEST(ObjectStoreTest, AFetchsHookRunsOnTheThreadThatReadiesItsValue) {
  FakeClockStore f(1 << 20);
  struct Seen {
    std::atomic<int> runs{0};
    std::atomic<size_t> bytes{0};
    std::thread::id on;
  };
  auto hook_of = [](Seen* seen) {
    return [seen](absl::StatusOr<std::shared_ptr<const Storage>> result) {
      seen->on = std::this_thread::get_id();
      if (result.ok()) seen->bytes = (*result)->size();
      seen->runs++;
    };
  };
  // Before its declaration (the fetch came first), then declared: the
  // declaration does not run it; the value does.
  const BufferKey key{81, 0};
  Seen seen;
  absl::StatusOr<std::shared_ptr<const Storage>> got;
  std::thread fetcher([&] { got = f.store->AwaitReady(key, hook_of(&seen)); });
  f.clock.AwaitWaiters(1);
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
  f.clock.AwaitWaiters(1);
  EXPECT_EQ(seen.runs.load(), 0);
  ASSERT_TRUE(f.store->Reserve(0, 16).ok());
  f.store->Fulfil(key, Bytes(16), 0);
  EXPECT_EQ(seen.runs.load(), 1);  // already, on this thread
  EXPECT_EQ(seen.on, std::this_thread::get_id());
  EXPECT_EQ(seen.bytes.load(), 16u);
  fetcher.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->size(), 16u);

  // Its wait ended at the unknown key's bound: the hook went with it.
  const BufferKey late{82, 0};
  Seen gone;
  std::thread waiter([&] { got = f.store->AwaitReady(late, hook_of(&gone)); });
  f.clock.AwaitWaiters(1);
  f.clock.Advance(absl::Seconds(31));
  waiter.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  f.store->Declare(late, 0, {DType::kF32, {4}}, /*owned=*/true);
  ASSERT_TRUE(f.store->Reserve(0, 16).ok());
  f.store->Fulfil(late, Bytes(16), 0);
  EXPECT_EQ(gone.runs.load(), 0);

  // A value ready already: returned at once, no hook.
  Seen now;
  got = f.store->AwaitReady(key, hook_of(&now));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(now.runs.load(), 0);
}

TEST(ObjectStoreTest, AFetchBeforeItsDeclarationGetsItsFailure) {
  FakeClockStore f(1 << 20);
  const BufferKey key{78, 0};
  absl::StatusOr<std::shared_ptr<const Storage>> got;
  std::thread fetcher([&] { got = f.store->AwaitReady(key); });
  f.clock.AwaitWaiters(1);
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
  f.store->Fail(key, absl::InternalError("program 'p' failed on shard 0"));
  fetcher.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "program 'p' failed"))
      << got.status();
}

TEST(ObjectStoreTest, UnknownKeyWaitEndsWhenItsClientLeaves) {
  FakeClockStore f(1 << 20);
  const uint64_t id = ClientMadeId(uint64_t{7}, 3);
  absl::Status got;
  std::thread fetcher([&] { got = f.store->AwaitReady({id, 0}).status(); });
  f.clock.AwaitWaiters(1);
  f.store->ReleaseClient(7);
  fetcher.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(got.message(), "client 7, which has left"))
      << got;
}

TEST(ObjectStoreTest, AnEarlierServersTemporaryIsRefusedOnceTheFloorIsKnown) {
  // A peer's push of a temporary the last server made, arriving before
  // the worker registered with the next: it waits (it may be declared)
  // until the next server's floor says it was an earlier server's.
  FakeClockStore f(1 << 20);
  const uint64_t old_temp = ClientMadeId(kServerClientId, 17);
  const uint64_t new_temp = ClientMadeId(kServerClientId, 1 << 20);
  absl::Status pushed;
  std::thread pusher([&] {
    pushed = f.store->AdmitIncoming({old_temp, 0}, 16, false);
  });
  f.clock.AwaitWaiters(1);
  f.store->SetTemporaryFloor(1 << 20);
  pusher.join();
  EXPECT_EQ(pushed.code(), absl::StatusCode::kFailedPrecondition) << pushed;
  EXPECT_TRUE(absl::StrContains(pushed.message(), "of an earlier server"))
      << pushed;
  // Refused at once from then on, reads too.
  EXPECT_EQ(f.store->AwaitReady({old_temp, 1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // This server's own, pushed before its declaration, still waits for it.
  std::thread early([&] {
    pushed = f.store->AdmitIncoming({new_temp, 0}, 16, false);
  });
  f.clock.AwaitWaiters(1);
  f.store->Declare({new_temp, 0}, 0, {DType::kF32, {4}}, /*owned=*/false,
                   kPeer);
  early.join();
  EXPECT_TRUE(pushed.ok()) << pushed;
  // An earlier server's temporary that is declared here is taken as ever.
  f.store->Declare({old_temp, 2}, 0, {DType::kF32, {4}}, /*owned=*/false,
                   kPeer);
  EXPECT_TRUE(f.store->AdmitIncoming({old_temp, 2}, 16, false).ok());
}

TEST(ObjectStoreTest, APutReleasedThenFailedRefusesItsLateBytesUntilReleased) {
  // A put lost in a shrink on loss (src/plexus/server/scheduling/
  // resize_slice.cc): the server releases it on the hosts left, then fails
  // it there. Bytes the client sent before it heard of the shrink end at
  // once with the loss, rather than wait for a declaration.
  FakeClockStore f(1 << 20);
  const BufferKey key{ClientMadeId(uint64_t{3}, 11), 2};
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true,
                   ObjectStore::Arrival::kFromClient);
  f.store->Release(key.buffer_id);
  const absl::Status lost = absl::DataLossError("slice 1 shrank from 4 to 3");
  f.store->FailBuffer(key.buffer_id, lost);
  EXPECT_EQ(f.store->AdmitIncoming(key, 16, /*from_client=*/true), lost);
  // The client lets go of it: the id is forgotten here (a later put under
  // it, which no client makes, would wait for its declaration again).
  f.store->Release(key.buffer_id);
  absl::Status admitted;
  std::thread putter([&] {
    admitted = f.store->AdmitIncoming(key, 16, /*from_client=*/true);
  });
  f.clock.AwaitWaiters(1);
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true,
                   ObjectStore::Arrival::kFromClient);
  putter.join();
  EXPECT_TRUE(admitted.ok()) << admitted;
}

TEST(ObjectStoreTest, AReadOfAReleasedShardEndsAtOnceSayingSo) {
  // A fetch that resolved a value before the client heard it moved (a
  // resize the server decided): the old copy was released and erased here
  // before the fetch came. It used to wait 10 minutes for a declaration.
  FakeClockStore f(1 << 20);
  const BufferKey key{ClientMadeId(uint64_t{3}, 9), 0};
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
  ASSERT_TRUE(f.store->Reserve(0, 16).ok());
  f.store->Fulfil(key, Bytes(16), 0);
  f.store->Release(key.buffer_id);
  absl::Status got = f.store->AwaitReady(key).status();
  EXPECT_TRUE(IsReleasedOnWorker(got)) << got;
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(got.message(), KeyString(key))) << got;
  // A waiter parked on it when the value was made and released at once
  // (its owner let go while it was computed) hears the same.
  const BufferKey pending{ClientMadeId(uint64_t{3}, 10), 0};
  f.store->Declare(pending, 0, {DType::kF32, {4}}, /*owned=*/true);
  absl::StatusOr<std::shared_ptr<const Storage>> waited;
  std::thread waiter([&] { waited = f.store->AwaitInput(pending); });
  // A wait for a shard being computed has no deadline: the store lists it
  // once it blocks (bounded: 10 s).
  std::vector<AwaitedInput> awaited;
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       f.store->AwaitedInputs(1, &awaited) == 0 && absl::Now() < until;) {
    std::this_thread::yield();
  }
  ASSERT_EQ(f.store->AwaitedInputs(1, &awaited), 1);
  f.store->Release(pending.buffer_id);
  ASSERT_TRUE(f.store->Reserve(0, 16).ok());
  f.store->Fulfil(pending, Bytes(16), 0);
  waiter.join();
  EXPECT_TRUE(IsReleasedOnWorker(waited.status())) << waited.status();
  // Data on its way in for it (a put sent again after a server restart
  // released the value) waits for its declaration, as ever.
  absl::Status admitted;
  std::thread putter([&] {
    admitted = f.store->AdmitIncoming(key, 16, /*from_client=*/true);
  });
  f.clock.AwaitWaiters(1);
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true,
                   ObjectStore::Arrival::kFromClient);
  putter.join();
  EXPECT_TRUE(admitted.ok()) << admitted;
  f.store->FulfilIncoming(key, Bytes(16));
  EXPECT_TRUE(f.store->AwaitReady(key).ok());
  f.store->Release(key.buffer_id);
  // Declared again under its id (a call sent again after a server
  // restart): read as ever.
  f.store->Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
  ASSERT_TRUE(f.store->Reserve(0, 16).ok());
  f.store->Fulfil(key, Bytes(16), 0);
  EXPECT_TRUE(f.store->AwaitReady(key).ok());
}

TEST(ObjectStoreTest, UnknownKeyWaitEndsAtTheDeadlineSayingSo) {
  FakeClockStore f(1 << 20);
  absl::Status got;
  std::thread fetcher([&] { got = f.store->AwaitReady({99, 0}).status(); });
  f.clock.AwaitWaiters(1);
  f.clock.Advance(absl::Seconds(29));
  f.clock.AwaitWaiters(1);  // still waiting: the deadline is not reached
  f.clock.Advance(absl::Seconds(2));
  fetcher.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(got.message(), "waited 30s")) << got;
}

TEST(ObjectStoreTest, ClientPutWaitsForRoomThenTimesOut) {
  FakeClockStore f(100);
  BufferKey full{30, 0}, key{31, 0};
  f.store->Declare(full, 0, {DType::kF32, {20}}, true);
  ASSERT_TRUE(f.store->Reserve(0, 80).ok());
  f.store->Fulfil(full, Bytes(80), 0);
  f.store->Declare(key, 0, {DType::kF32, {10}}, true, kClient);
  absl::Status admitted;
  std::thread sender([&] { admitted = f.store->AdmitIncoming(key, 40, true); });
  f.clock.AwaitWaiters(1);
  f.clock.Advance(absl::Seconds(31));
  sender.join();
  EXPECT_EQ(admitted.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(f.store->Stats().device_bytes[0], 80);  // nothing over budget
}

TEST(ObjectStoreTest, ShutdownEndsEveryWait) {
  FakeClockStore f(1 << 20);
  absl::Status got;
  std::thread fetcher([&] { got = f.store->AwaitReady({5, 0}).status(); });
  f.clock.AwaitWaiters(1);
  f.store->Shutdown();
  fetcher.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kCancelled);
}

TEST(ObjectStoreTest, APutReleasedBeforeItsBytesFailsAndGoes) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{32, 0};
  store.Declare(key, 0, {DType::kF32, {4}}, true, kClient);
  absl::Status seen;
  store.OnReady(key, [&](auto r) { seen = r.status(); });
  store.Release(32);
  EXPECT_EQ(seen.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store.Stats().live_shards, 0);  // no pending entry left for good
}

TEST(ObjectStoreTest, APutOfAClientThatLeftFailsItsReaders) {
  ObjectStore store(TwoDevices(1 << 20));
  const uint64_t id = ClientMadeId(uint64_t{8}, 1);
  store.Declare({id, 0}, 0, {DType::kF32, {4}}, true, kClient);
  ASSERT_TRUE(store.AddReader({id, 0}).ok());  // a queued call reads it
  store.ReleaseClient(8);
  absl::Status s = store.AwaitReady({id, 0}).status();
  EXPECT_TRUE(absl::StrContains(s.message(), "client 8 left")) << s;
  store.RemoveReader({id, 0});
  EXPECT_EQ(store.Stats().live_shards, 0);
}

TEST(ObjectStoreTest, AFailureWithAnOkReasonStillFails) {
  ObjectStore store(TwoDevices(1 << 20));
  BufferKey key{33, 0};
  store.Declare(key, 0, {DType::kF32, {1}}, true);
  absl::Status seen;
  store.OnReady(key, [&](auto r) { seen = r.status(); });
  store.Fail(key, absl::OkStatus());  // aborted the process before
  EXPECT_EQ(seen.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(store.AwaitReady(key).status().code(), absl::StatusCode::kUnknown);
}

TEST(ObjectStoreTest, ADeclarationWakesAPutWaitingOnAnEntryMadeBeforeIt) {
  FakeClockStore f(1 << 20);
  BufferKey key{34, 0};
  f.store->OnReady(key, [](auto) {});  // makes the entry, undeclared
  absl::Status admitted;
  std::thread sender([&] { admitted = f.store->AdmitIncoming(key, 16, true); });
  f.clock.AwaitWaiters(1);
  f.store->Declare(key, 0, {DType::kF32, {4}}, true, kClient);
  sender.join();  // waited for the fake clock's deadline before the fix
  EXPECT_TRUE(admitted.ok()) << admitted;
}

TEST(ObjectStoreTest, ADonatedShardIsGoneAndItsChargeGoesToTheOutput) {
  ObjectStore store(TwoDevices(1 << 20));
  const BufferKey in{7, 0}, out{8, 0};
  store.Declare(in, 0, {DType::kF32, {4}}, /*owned=*/true);
  store.Fulfil(in, Storage::OnDevice(std::make_shared<HeldDeviceBuffer>(16)), 0,
               /*reserved=*/false);
  ASSERT_TRUE(store.AddReader(in).ok());  // the donating call's pin
  auto held = store.AwaitReady(in);       // the call's reference
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(store.Stats().device_memory_shards, 1);
  const absl::Status gone = absl::FailedPreconditionError("donated to 'f'");
  ASSERT_TRUE(store.TakeForDonation(in, held->get(), 1, gone));
  // Readers learn it is gone; its bytes are still charged, as the
  // output's reservation.
  EXPECT_EQ(store.AwaitReady(in).status(), gone);
  EXPECT_EQ(store.Stats().device_bytes[0], 16);
  EXPECT_EQ(store.Stats().device_memory_shards, 0);
  store.Declare(out, 0, {DType::kF32, {4}}, /*owned=*/true);
  store.Fulfil(out, Storage::OnDevice(std::make_shared<HeldDeviceBuffer>(16)),
               0, /*reserved=*/true);
  EXPECT_EQ(store.Stats().device_bytes[0], 16);
  store.RemoveReader(in);
  store.Release(7);
  EXPECT_EQ(store.Stats().device_bytes[0], 16);
  store.Release(8);
  EXPECT_EQ(store.Stats().device_bytes[0], 0);
}

TEST(ObjectStoreTest, AShardSomethingElseHoldsIsNotDonated) {
  ObjectStore store(TwoDevices(1 << 20));
  const absl::Status gone = absl::FailedPreconditionError("donated");
  std::shared_ptr<const DeviceBuffer> buffer;
  auto device_value = [&](uint64_t id) {
    BufferKey key{id, 0};
    store.Declare(key, 0, {DType::kF32, {4}}, /*owned=*/true);
    buffer = std::make_shared<HeldDeviceBuffer>(16);
    store.Fulfil(key, Storage::OnDevice(buffer), 0, /*reserved=*/false);
    EXPECT_TRUE(store.AddReader(key).ok());
    return *store.AwaitReady(key);
  };
  // Another reader pinned it.
  auto a = device_value(1);
  buffer.reset();
  ASSERT_TRUE(store.AddReader({1, 0}).ok());
  EXPECT_FALSE(store.TakeForDonation({1, 0}, a.get(), 1, gone));
  // A reference the caller does not count (a transfer, a fetch).
  auto b = device_value(2);
  buffer.reset();
  auto sending = b;
  EXPECT_FALSE(store.TakeForDonation({2, 0}, b.get(), 1, gone));
  // Its device buffer has another owner (`buffer`, as another block
  // would).
  auto c = device_value(3);
  EXPECT_FALSE(store.TakeForDonation({3, 0}, c.get(), 1, gone));
  // Host memory, or not the entry's data.
  store.Declare({4, 0}, 0, {DType::kF32, {4}}, /*owned=*/true);
  store.Fulfil({4, 0}, Bytes(16), 0, /*reserved=*/false);
  ASSERT_TRUE(store.AddReader({4, 0}).ok());
  auto d = *store.AwaitReady({4, 0});
  EXPECT_FALSE(store.TakeForDonation({4, 0}, d.get(), 1, gone));
  EXPECT_FALSE(store.TakeForDonation({1, 0}, b.get(), 1, gone));
  // Each is still there.
  for (uint64_t id : {1, 2, 3, 4}) {
    EXPECT_TRUE(store.AwaitReady({id, 0}).ok()) << id;
  }
}

}  // namespace
}  // namespace plexus
