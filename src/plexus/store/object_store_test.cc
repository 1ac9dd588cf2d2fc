#include "plexus/store/object_store.h"

#include <thread>

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
  store.AddReader(key);
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
  store.AddReader(key);
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
  store.Declare(key, 0, {DType::kF32, {1}}, true, /*source_worker=*/2);
  absl::Status seen;
  store.OnReady(key, [&](auto r) { seen = r.status(); });
  store.FailFromSource(2, absl::UnavailableError("worker 2 died"));
  EXPECT_EQ(seen.message(), "worker 2 died");
  EXPECT_EQ(store.AwaitReady(key).status().message(), "worker 2 died");
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

}  // namespace
}  // namespace plexus
