// ObjectStore::WatchReady: AwaitReady's hook without a thread blocked in
// it (the data plane's parked FETCH), its pokes, its end and AwaitWatched.
#include <atomic>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "plexus/common/clock.h"
#include "plexus/store/object_store.h"

namespace plexus {
namespace {

using Result = absl::StatusOr<std::shared_ptr<const Storage>>;

struct Watched {
  explicit Watched(absl::Duration unknown_key_timeout = absl::Seconds(30)) {
    ObjectStore::Options o;
    o.device_memory = {1 << 20};
    o.clock = &clock;
    o.unknown_key_timeout = unknown_key_timeout;
    store = std::make_unique<ObjectStore>(o);
  }
  // Watches `key`: the result now, if there is one.
  std::optional<Result> Watch(const BufferKey& key) {
    return store->WatchReady(
        key,
        [this](Result r) {
          ++hooked;
          hooked_with = std::move(r);
        },
        [this] { ++poked; }, &watch);
  }
  FakeClock clock;
  std::unique_ptr<ObjectStore> store;
  ObjectStore::Watch watch;
  std::atomic<int> hooked{0};
  std::atomic<int> poked{0};
  Result hooked_with = absl::UnknownError("not hooked");
};

const TensorSpec kSpec{DType::kF32, {4}};

std::shared_ptr<Storage> Bytes(size_t n) { return *Storage::Allocate(n); }

TEST(ObjectStoreWatchTest, AShardReadyOrFailedIsTheResultNowAndNothingIsKept) {
  Watched w;
  const BufferKey ready{ClientMadeId(uint64_t{1}, 1), 0};
  w.store->Declare(ready, 0, kSpec, /*owned=*/true);
  w.store->Fulfil(ready, Bytes(16), 0, /*reserved=*/false);
  std::optional<Result> now = w.Watch(ready);
  ASSERT_TRUE(now.has_value());
  ASSERT_TRUE(now->ok()) << now->status();
  EXPECT_EQ((**now)->size(), 16u);

  const BufferKey failed{ClientMadeId(uint64_t{1}, 2), 0};
  w.store->Declare(failed, 0, kSpec, /*owned=*/true);
  w.store->Fail(failed, absl::DataLossError("the program failed"));
  now = w.Watch(failed);
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->status(), absl::DataLossError("the program failed"));

  // A client that has left: a read of its keys ends at once.
  w.store->ReleaseClient(2);
  now = w.Watch({ClientMadeId(uint64_t{2}, 1), 0});
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.hooked.load(), 0);
  EXPECT_EQ(w.poked.load(), 0);
}

// The FETCH that comes before the call that declares its value (the
// common case: the call goes through the server, the fetch straight to
// the worker) and the one that comes after: either way the thread that
// readies the value runs the hook, once; nothing pokes.
TEST(ObjectStoreWatchTest, TheHookRunsWhereTheShardIsReadied) {
  for (bool declared_first : {false, true}) {
    Watched w;
    const BufferKey key{ClientMadeId(uint64_t{1}, 3), 0};
    if (declared_first) w.store->Declare(key, 0, kSpec, /*owned=*/true);
    ASSERT_FALSE(w.Watch(key).has_value());
    EXPECT_EQ(w.watch.deadline, declared_first
                                    ? absl::InfiniteFuture()
                                    : w.clock.Now() + absl::Seconds(30));
    if (!declared_first) w.store->Declare(key, 0, kSpec, /*owned=*/true);
    EXPECT_EQ(w.hooked.load(), 0);  // a declaration is not a value
    w.store->Fulfil(key, Bytes(16), 0, /*reserved=*/false);
    EXPECT_EQ(w.hooked.load(), 1);
    ASSERT_TRUE(w.hooked_with.ok()) << w.hooked_with.status();
    EXPECT_EQ((*w.hooked_with)->size(), 16u);
    EXPECT_EQ(w.poked.load(), 0);
    // Its end, then what a late finish reads: the value.
    Result awaited = w.store->AwaitWatched(key, w.watch);
    ASSERT_TRUE(awaited.ok()) << awaited.status();
    EXPECT_EQ(w.hooked.load(), 1);
  }
}

TEST(ObjectStoreWatchTest, AFailureIsHandedToTheHook) {
  Watched w;
  const BufferKey key{ClientMadeId(uint64_t{1}, 4), 0};
  ASSERT_FALSE(w.Watch(key).has_value());
  w.store->Declare(key, 0, kSpec, /*owned=*/true);
  w.store->Fail(key, absl::ResourceExhaustedError("out of device memory"));
  EXPECT_EQ(w.hooked.load(), 1);
  EXPECT_EQ(w.hooked_with.status(),
            absl::ResourceExhaustedError("out of device memory"));
  w.store->EndWatch(key, w.watch);
}

// What would wake a blocked wait to look again pokes a watch instead; its
// finish (AwaitWatched) then reads why the wait ends.
TEST(ObjectStoreWatchTest, WhatEndsAWaitPokesTheWatch) {
  {
    Watched w;
    const BufferKey key{ClientMadeId(uint64_t{1}, 5), 0};
    ASSERT_FALSE(w.Watch(key).has_value());
    w.store->FailBuffer(key.buffer_id, absl::InvalidArgumentError("refused"));
    EXPECT_GE(w.poked.load(), 1);
    EXPECT_EQ(w.store->AwaitWatched(key, w.watch).status(),
              absl::InvalidArgumentError("refused"));
  }
  {
    Watched w;
    const BufferKey key{ClientMadeId(uint64_t{3}, 1), 0};
    ASSERT_FALSE(w.Watch(key).has_value());
    w.store->ReleaseClient(3);
    EXPECT_EQ(w.poked.load(), 1);
    Result r = w.store->AwaitWatched(key, w.watch);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "has left"))
        << r.status();
  }
  {
    // A declared (pending) value's watch is poked by the shutdown too.
    Watched w;
    const BufferKey key{ClientMadeId(uint64_t{1}, 6), 0};
    w.store->Declare(key, 0, kSpec, /*owned=*/true);
    ASSERT_FALSE(w.Watch(key).has_value());
    w.store->Shutdown();
    EXPECT_EQ(w.poked.load(), 1);
    EXPECT_EQ(w.store->AwaitWatched(key, w.watch).status().code(),
              absl::StatusCode::kCancelled);
  }
}

// An ended watch is neither poked nor hooked, and holds no key wait: the
// key's later value, and later events, reach no one.
TEST(ObjectStoreWatchTest, AnEndedWatchHearsNothingMore) {
  Watched w;
  const BufferKey key{ClientMadeId(uint64_t{1}, 7), 0};
  ASSERT_FALSE(w.Watch(key).has_value());
  w.store->EndWatch(key, w.watch);
  w.store->EndWatch(key, w.watch);  // twice: nothing more
  w.store->Declare(key, 0, kSpec, /*owned=*/true);
  w.store->Fulfil(key, Bytes(16), 0, /*reserved=*/false);
  w.store->ReleaseClient(5);
  EXPECT_EQ(w.hooked.load(), 0);
  EXPECT_EQ(w.poked.load(), 0);
}

// An unknown key's finish waits only until the watch's deadline, set when
// the watch began: the connection's thread, woken at that deadline, does
// not wait a second bound.
TEST(ObjectStoreWatchTest, AnUnknownKeysFinishEndsAtTheWatchsDeadline) {
  Watched w(absl::Seconds(30));
  const BufferKey key{ClientMadeId(uint64_t{1}, 8), 0};
  ASSERT_FALSE(w.Watch(key).has_value());
  w.clock.Advance(absl::Seconds(31));
  Result r = w.store->AwaitWatched(key, w.watch);  // returns at once
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "never declared"))
      << r.status();
}

}  // namespace
}  // namespace plexus
