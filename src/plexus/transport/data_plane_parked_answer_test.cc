// A FETCH or WAIT parked (internal/fetch_answers.h): the connection's
// thread goes back to its socket while the handler watches the shard
// (DataPlaneHandler::WatchReady); the hook answers, or wakes the thread
// where it cannot; the next frame, the client's departure and an unknown
// key's bound finish it.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/store/storage.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport {
namespace {

using test_support::Client;
using test_support::Filled;
using test_support::kDeadline;
using test_support::MapHandler;
using test_support::UniqueUnixName;
using test_support::Valued;
using Result = absl::StatusOr<std::shared_ptr<const Storage>>;

std::string Text(const Storage& s) {
  return std::string(static_cast<const char*>(s.data()), s.size());
}

// A handler that watches every shard it is not told the result of (the
// test plays the thread that readies it, holding the hook and the poke),
// and counts what the connection's thread asks of it: an AwaitWatched is
// that thread woken to finish the answer itself.
class WatchingHandler : public MapHandler {
 public:
  std::optional<Result> WatchReady(const ShardKey& key,
                                   const ReadyHook& on_ready,
                                   std::function<void()> poke,
                                   ReadyWatch* watch) override {
    absl::MutexLock lock(&mu_);
    if (now_.has_value()) return *std::exchange(now_, std::nullopt);
    hook_ = on_ready;
    poke_ = std::move(poke);
    watch->id = ++watches_;
    watch->deadline = deadline_;
    return std::nullopt;
  }
  void EndWatch(const ShardKey&, const ReadyWatch& watch) override {
    absl::MutexLock lock(&mu_);
    ended_.push_back(watch.id);
  }
  Result AwaitWatched(const ShardKey&, const ReadyWatch& watch) override {
    absl::MutexLock lock(&mu_);
    ended_.push_back(watch.id);
    ++finished_;
    return finish_with_;
  }

  // The next watch's result now (not watched).
  void AnswerNext(Result now) {
    absl::MutexLock lock(&mu_);
    now_ = std::move(now);
  }
  // What a finish returns; the deadline of the next watches.
  void FinishWith(Result r) {
    absl::MutexLock lock(&mu_);
    finish_with_ = std::move(r);
  }
  void SetDeadline(absl::Time t) {
    absl::MutexLock lock(&mu_);
    deadline_ = t;
  }
  // The hook and poke of watch `n` (1, 2, ...), once it began.
  std::pair<ReadyHook, std::function<void()>> AwaitWatch(uint64_t n) {
    absl::MutexLock lock(&mu_);
    auto began = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return watches_ >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&began), kDeadline);
    return {hook_, poke_};
  }
  // The watches ended (by EndWatch or AwaitWatched), once there are `n`.
  std::vector<uint64_t> AwaitEnded(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kDeadline);
    return ended_;
  }
  std::vector<uint64_t> ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  int finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  absl::Mutex mu_;
  std::optional<Result> now_ ABSL_GUARDED_BY(mu_);
  ReadyHook hook_ ABSL_GUARDED_BY(mu_);
  std::function<void()> poke_ ABSL_GUARDED_BY(mu_);
  uint64_t watches_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> ended_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  Result finish_with_ ABSL_GUARDED_BY(mu_) =
      absl::InternalError("no finish expected");
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

struct Served {
  explicit Served(Timeline* timeline = nullptr) {
    DataPlaneServerOptions options;
    options.unix_name = UniqueUnixName();
    options.timeline = timeline;
    unix_name = options.unix_name;
    auto started = DataPlaneServer::Start(options, &handler, &counters);
    EXPECT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
  }
  std::unique_ptr<DataPlaneConnection> Connect(bool over_unix) {
    auto conn = DataPlaneConnection::Connect(
        server->tcp_address(), over_unix ? unix_name : std::string(), nullptr,
        Client(1, Filled(0)));
    EXPECT_TRUE(conn.ok()) << conn.status();
    return conn.ok() ? *std::move(conn) : nullptr;
  }
  WatchingHandler handler;
  DataPlaneCounters counters;
  std::string unix_name;
  std::unique_ptr<DataPlaneServer> server;
};

const ShardKey kKey{ClientMadeId(uint64_t{1}, 5), 0};

// The hook's answer reaches the client while the connection's thread
// stays parked: it neither finishes the answer (no AwaitWatched) nor ends
// the watch until the next frame comes, which it serves after. Over
// either carrier; the timeline's event ends when the hook sent.
TEST(DataPlaneParkedAnswerTest, TheHookAnswersWhileTheConnectionsThreadSleeps) {
  Timeline timeline;
  Served s(&timeline);
  uint64_t watch = 0;
  for (bool over_unix : {false, true}) {
    auto conn = s.Connect(over_unix);
    ASSERT_NE(conn, nullptr);
    Result fetched = absl::UnknownError("not yet");
    std::thread fetch([&] { fetched = conn->Fetch(kKey); });
    auto [hook, poke] = s.handler.AwaitWatch(++watch);
    const int64_t before_ns = timeline.NowNs();
    hook(Valued(100, 'a'));
    const int64_t after_ns = timeline.NowNs();
    fetch.join();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(Text(**fetched), std::string(100, 'a'));
    EXPECT_EQ(s.handler.finished(), 0);
    EXPECT_EQ(s.handler.ended().size(), watch - 1);  // this one still kept
    hook(Valued(100, 'z'));  // a second run of the hook sends nothing
    // A WAIT known at once: the parked FETCH is finished first.
    s.handler.AnswerNext(Valued(4, 'b'));
    EXPECT_TRUE(conn->Wait(kKey).ok());
    EXPECT_EQ(s.handler.AwaitEnded(watch).back(), watch);
    EXPECT_EQ(s.handler.finished(), 0);
    bool recorded = false;
    for (const TimelineEvent& e : timeline.Since(0)) {
      if (e.kind != EventKind::kFetch || e.start_ns > before_ns) continue;
      if (e.end_ns < before_ns) continue;  // the last carrier's
      recorded = true;
      EXPECT_LE(e.end_ns, after_ns) << "the event ends at the hook's send";
      EXPECT_EQ(e.buffer_id, kKey.buffer_id);
    }
    EXPECT_TRUE(recorded) << "no FETCH event for the parked answer";
  }
  EXPECT_EQ(s.counters.early_answers.load(), 2);
}

// What the hook cannot send (a value too large for it, an error, which
// the connection's thread words) wakes the thread, which finishes the
// answer with what the handler's wait returns; so does a poke.
TEST(DataPlaneParkedAnswerTest, WhatTheHookCannotSendWakesTheThread) {
  Served s;
  auto conn = s.Connect(/*over_unix=*/true);
  ASSERT_NE(conn, nullptr);
  const size_t large = internal::FrameSocket::kSmallFrameBytes + 1;
  Result fetched = absl::UnknownError("not yet");

  s.handler.FinishWith(Valued(large, 'c'));
  std::thread fetch([&] { fetched = conn->Fetch(kKey); });
  s.handler.AwaitWatch(1).first(Valued(large, 'c'));
  fetch.join();
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(Text(**fetched), std::string(large, 'c'));
  EXPECT_EQ(s.handler.finished(), 1);

  const absl::Status failed = absl::DataLossError("the program failed: nan");
  s.handler.FinishWith(failed);
  fetch = std::thread([&] { fetched = conn->Fetch(kKey); });
  s.handler.AwaitWatch(2).first(failed);
  fetch.join();
  EXPECT_EQ(fetched.status(), failed);  // code and message intact
  EXPECT_TRUE(conn->healthy());

  s.handler.FinishWith(absl::FailedPreconditionError("client 1 has left"));
  fetch = std::thread([&] { fetched = conn->Fetch(kKey); });
  s.handler.AwaitWatch(3).second();
  fetch.join();
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.handler.finished(), 3);
  EXPECT_EQ(s.counters.early_answers.load(), 0);
}

// A client that leaves while its answer is parked: the thread wakes at
// the socket's end, ends the watch without waiting for the value, and a
// hook that runs later sends nothing (the socket is gone).
TEST(DataPlaneParkedAnswerTest, AClientThatLeavesEndsItsParkedAnswer) {
  Served s;
  auto conn = s.Connect(/*over_unix=*/true);
  ASSERT_NE(conn, nullptr);
  std::thread fetch([&] { conn->Fetch(kKey).IgnoreError(); });
  auto [hook, poke] = s.handler.AwaitWatch(1);
  conn->Shutdown();  // the client's side closes; its Fetch returns
  fetch.join();
  EXPECT_EQ(s.handler.AwaitEnded(1), std::vector<uint64_t>{1});
  EXPECT_EQ(s.handler.finished(), 0);
  hook(Valued(8, 'd'));
  EXPECT_EQ(s.counters.early_answers.load(), 0);
}

// An unknown key's bound: the parked thread wakes at the watch's deadline
// (here already past) and finishes with the handler's word on it.
TEST(DataPlaneParkedAnswerTest, AnUnknownKeysBoundWakesTheThread) {
  Served s;
  auto conn = s.Connect(/*over_unix=*/false);
  ASSERT_NE(conn, nullptr);
  s.handler.SetDeadline(absl::Now() - absl::Seconds(1));
  s.handler.FinishWith(absl::NotFoundError("never declared here"));
  Result fetched = conn->Fetch(kKey);
  EXPECT_EQ(fetched.status(), absl::NotFoundError("never declared here"));
  EXPECT_EQ(s.handler.finished(), 1);
}

}  // namespace
}  // namespace plexus::transport
