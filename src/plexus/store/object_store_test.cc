#include "plexus/store/object_store.h"

#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

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

TEST(ObjectStoreTest, ShardLargerThanBudgetFailsAtOnce) {
  ObjectStore store(TwoDevices(100));
  absl::Status s = store.Reserve(1, 101);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("can never fit device 1"), std::string::npos);
}

TEST(ObjectStoreTest, ReleaseClientDropsOnlyThatClientsBuffers) {
  ObjectStore store(TwoDevices(1 << 20));
  uint64_t a = (uint64_t{5} << kBufferIdClientShift) | 1;
  uint64_t b = (uint64_t{6} << kBufferIdClientShift) | 1;
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

TEST(ObjectStoreTest, UnknownKeyWaitEndsWhenItsClientLeaves) {
  FakeClockStore f(1 << 20);
  const uint64_t id = (uint64_t{7} << kBufferIdClientShift) | 3;
  absl::Status got;
  std::thread fetcher([&] { got = f.store->AwaitReady({id, 0}).status(); });
  f.clock.AwaitWaiters(1);
  f.store->ReleaseClient(7);
  fetcher.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(got.message(), "client 7, which has left"))
      << got;
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
  const uint64_t id = (uint64_t{8} << kBufferIdClientShift) | 1;
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

}  // namespace
}  // namespace plexus
