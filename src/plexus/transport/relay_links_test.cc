// Relay links (relay_links.h): a client's RELAY connection takes the
// answers its worker relays, sent by whatever thread decides them, without
// blocking; a link that cannot take one is shut, never waited on.
#include "plexus/transport/relay_links.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/store/storage.h"
#include "plexus/timeline/timeline.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport {
namespace {

using test_support::Client;
using test_support::Filled;
using test_support::MapHandler;
using test_support::UniqueUnixName;
using test_support::Valued;

constexpr uint64_t kClient = 1;

std::string Text(const Storage& s) {
  return std::string(static_cast<const char*>(s.data()), s.size());
}

// A data plane whose handler hands RELAY connections to a RelayLinks, as
// the worker's does.
class RelayHandler : public MapHandler {
 public:
  explicit RelayHandler(RelayLinks& links) : links_(links) {}
  absl::Status OpenRelay(const DataPlanePeer& peer, int fd) override {
    return links_.Open(peer.id, fd);
  }
  void RelayEnded(const DataPlanePeer& peer, int fd) override {
    links_.Ended(peer.id, fd);
    absl::MutexLock lock(&mu_);
    ++ended_;
  }
  // Waits (at most 20 s) until `n` relay connections have ended.
  bool AwaitEnded(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(20));
  }

 private:
  RelayLinks& links_;
  absl::Mutex mu_;
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Served {
  Served() : links(&counters, &timeline), handler(links) {
    DataPlaneServerOptions options;
    options.unix_name = UniqueUnixName();
    unix_name = options.unix_name;
    auto started = DataPlaneServer::Start(options, &handler, &counters);
    EXPECT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
  }
  // A connection of client kClient that took its relay.
  std::unique_ptr<DataPlaneConnection> Link(bool over_unix) {
    auto conn = DataPlaneConnection::Connect(
        server->tcp_address(), over_unix ? unix_name : std::string(), nullptr,
        Client(kClient, Filled(0)));
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) return nullptr;
    absl::Status opened = (*conn)->OpenRelay(absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(opened.ok()) << opened;
    return *std::move(conn);
  }
  DataPlaneConnection::Relayed Read(DataPlaneConnection& conn) {
    auto got = conn.ReadRelayed(absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *std::move(got) : DataPlaneConnection::Relayed{};
  }
  DataPlaneCounters counters;
  Timeline timeline;
  RelayLinks links;
  RelayHandler handler;
  std::string unix_name;
  std::unique_ptr<DataPlaneServer> server;
};

const ShardKey kKey{ClientMadeId(kClient, 5), 0};

// A small value goes as DATA, a failure as ERROR (code and message
// intact), a large value as SKIP, each on the thread that answers, over
// either carrier; with the timeline's FETCH event.
TEST(RelayLinksTest, AnswersReachTheClientsLink) {
  Served s;
  for (bool over_unix : {false, true}) {
    auto conn = s.Link(over_unix);
    ASSERT_NE(conn, nullptr);
    ASSERT_TRUE(s.links.Has(kClient));
    s.links.Answer(kClient, kKey, Valued(100, 'a'), s.timeline.NowNs());
    DataPlaneConnection::Relayed data = s.Read(*conn);
    EXPECT_EQ(data.key, kKey);
    ASSERT_TRUE(data.result.has_value());
    ASSERT_TRUE(data.result->ok()) << data.result->status();
    EXPECT_EQ(Text(***data.result), std::string(100, 'a'));

    s.links.Answer(kClient, {kKey.buffer_id, -1},
                   absl::ResourceExhaustedError("out of device memory"));
    DataPlaneConnection::Relayed error = s.Read(*conn);
    EXPECT_EQ(error.key.shard, -1);
    ASSERT_TRUE(error.result.has_value());
    EXPECT_EQ(error.result->status(),
              absl::ResourceExhaustedError("out of device memory"));

    s.links.Answer(kClient, kKey, Valued(kRelayedValueBytes + 1, 'b'));
    DataPlaneConnection::Relayed skip = s.Read(*conn);
    EXPECT_EQ(skip.key, kKey);
    EXPECT_FALSE(skip.result.has_value());
  }
  EXPECT_EQ(s.counters.relayed_answers.load(), 6);
  int fetches = 0;
  for (const TimelineEvent& e : s.timeline.Since(0)) {
    if (e.kind == EventKind::kFetch && e.client_id == kClient) ++fetches;
  }
  EXPECT_EQ(fetches, 6);
}

// No link, no answer; a client's later RELAY replaces its link (the old
// one ends); a frame after the RELAY closes the connection and its link.
TEST(RelayLinksTest, ALinkIsTheClientsLatestAndEndsWithItsConnection) {
  Served s;
  s.links.Answer(kClient, kKey, Valued(4, 'a'));  // nowhere to go
  EXPECT_EQ(s.counters.relayed_answers.load(), 0);
  auto first = s.Link(/*over_unix=*/true);
  auto second = s.Link(/*over_unix=*/true);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(first->ReadRelayed(absl::Now() + absl::Seconds(20)).ok())
      << "the replaced link was shut down";
  s.links.Answer(kClient, kKey, Valued(4, 'c'));
  EXPECT_EQ(Text(***s.Read(*second).result), "cccc");
  EXPECT_TRUE(s.handler.AwaitEnded(1)) << "the replaced link's connection";
  EXPECT_TRUE(s.links.Has(kClient)) << "its end leaves the new link be";
  // Nothing may follow a RELAY: the connection closes, its link goes.
  EXPECT_FALSE(second->Wait(kKey).ok());
  EXPECT_TRUE(s.handler.AwaitEnded(2));
  EXPECT_FALSE(s.links.Has(kClient));
}

// A client that leaves its answers unread: once its socket cannot take a
// whole frame, the link is shut, not waited on (the answering thread never
// blocks); the client reads what came, then the end.
TEST(RelayLinksTest, ALinkThatCannotTakeAnAnswerIsShut) {
  Served s;
  auto conn = s.Link(/*over_unix=*/true);
  ASSERT_NE(conn, nullptr);
  int sent = 0;
  for (; sent < 100000 && s.links.Has(kClient); ++sent) {
    s.links.Answer(kClient, {kKey.buffer_id, sent},
                   Valued(kRelayedValueBytes, 'x'));
  }
  EXPECT_FALSE(s.links.Has(kClient));
  EXPECT_EQ(s.counters.relay_links_shut.load(), 1);
  EXPECT_EQ(s.counters.relayed_answers.load(), sent - 1);
  int read = 0;
  while (conn->ReadRelayed(absl::Now() + absl::Seconds(20)).ok()) ++read;
  EXPECT_EQ(read, sent - 1) << "every whole frame, then the end";
}

}  // namespace
}  // namespace plexus::transport
