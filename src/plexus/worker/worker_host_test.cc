// WorkerHost: what a worker does when its server session ends, and the
// address it advertises. The rejoin decision is a pure function; the
// server restart runs a real server (twice, on one port) and a real worker
// in this process.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/server/server.h"
#include "plexus/worker/worker.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

TEST(ShouldRejoinTest, ARefusalForGoodIsNeverRetried) {
  for (bool standalone : {true, false}) {
    for (bool session : {true, false}) {
      EXPECT_FALSE(ShouldRejoin(absl::FailedPreconditionError("version"),
                                standalone, session));
      EXPECT_FALSE(ShouldRejoin(absl::PermissionDeniedError("credential"),
                                standalone, session));
    }
  }
}

TEST(ShouldRejoinTest, AStandaloneWorkerRejoinsWhateverEndedItsSession) {
  EXPECT_TRUE(
      ShouldRejoin(absl::CancelledError("the server ended it"), true, true));
  EXPECT_TRUE(
      ShouldRejoin(absl::UnavailableError("server vanished"), true, true));
  EXPECT_TRUE(
      ShouldRejoin(absl::UnavailableError("cannot reach"), true, false));
  EXPECT_TRUE(ShouldRejoin(absl::CancelledError("shutting down"), true, false));
}

TEST(ShouldRejoinTest, AnEmbeddedWorkerRejoinsOnlyAServerThatEndedItsSession) {
  // Declared down (or the server is stopping): one registration tells.
  EXPECT_TRUE(
      ShouldRejoin(absl::CancelledError("the server ended it"), false, true));
  // Its server vanished, or refuses it: it dies with its server.
  EXPECT_FALSE(
      ShouldRejoin(absl::UnavailableError("server vanished"), false, true));
  EXPECT_FALSE(
      ShouldRejoin(absl::CancelledError("shutting down"), false, false));
  EXPECT_FALSE(
      ShouldRejoin(absl::UnavailableError("cannot reach"), false, false));
}

TEST(AdvertisedDataAddressTest, AdvertiseHostWinsAndKeepsTheBoundPort) {
  EXPECT_EQ(AdvertisedDataAddress("0.0.0.0:7071", "node-3.cluster", ""),
            "node-3.cluster:7071");
  EXPECT_EQ(AdvertisedDataAddress("127.0.0.1:7071", "10.1.2.3", ""),
            "10.1.2.3:7071");
  EXPECT_EQ(AdvertisedDataAddress("[::]:7071", "fd00::3", ""),
            "[fd00::3]:7071");
}

TEST(AdvertisedDataAddressTest, ABoundAddressIsAdvertisedAsItIs) {
  EXPECT_EQ(AdvertisedDataAddress("10.1.2.3:7071", "", "10.9.9.9:5000"),
            "10.1.2.3:7071");
}

TEST(AdvertisedDataAddressTest, EveryInterfaceAdvertisesTheRouteToTheServer) {
  // Never 0.0.0.0: the source address of the route to the server.
  EXPECT_EQ(AdvertisedDataAddress("0.0.0.0:7071", "", "127.0.0.1:5000"),
            "127.0.0.1:7071");
}

// Registrations seen by a WorkerHost, for a test to wait on.
class Registrations {
 public:
  void Add(const Worker& w) {
    absl::MutexLock lock(&mu_);
    ids_.push_back(w.worker_id());
    generations_.push_back(w.generation());
  }
  // Waits until there are `n`; false after `timeout`.
  bool AwaitCount(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ids_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<uint64_t> generations() {
    absl::MutexLock lock(&mu_);
    return generations_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> ids_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> generations_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkerHostTest, AStandaloneWorkerRegistersWithARestartedServer) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  ServerOptions server_options;
  server_options.secret = *secret;
  auto first = Server::Start(server_options);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();

  WorkerOptions worker;
  worker.server_address = address;
  worker.secret = *secret;
  WorkerHostOptions host_options;
  host_options.standalone = true;
  host_options.backoff = {.initial = absl::Milliseconds(10),
                          .multiplier = 2,
                          .cap = absl::Milliseconds(200),
                          .give_up_after = absl::Seconds(60)};
  WorkerHost host(worker, host_options);
  Registrations seen;
  absl::Status end;
  std::thread run(
      [&] { end = host.Run([&](const Worker& w) { seen.Add(w); }); });
  ASSERT_TRUE(seen.AwaitCount(1, absl::Seconds(30)));
  ASSERT_TRUE((*first)->WaitForWorkers(1, absl::Seconds(30)).ok());

  // The server goes away; a new one comes up on the same address.
  first->reset();
  server_options.listen_address = address;
  auto second = Server::Start(server_options);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE((*second)->WaitForWorkers(1, absl::Seconds(30)).ok())
      << "the worker did not register with the restarted server";
  ASSERT_TRUE(seen.AwaitCount(2, absl::Seconds(30)));
  // A fresh registration: a newer generation than the last server's.
  EXPECT_GT(seen.generations()[1], seen.generations()[0]);

  host.Shutdown();
  run.join();
  EXPECT_TRUE(absl::IsCancelled(end)) << end;
}

TEST(WorkerHostTest, AnEmbeddedWorkerEndsSoonAfterItsServerShutsDown) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  ServerOptions server_options;
  server_options.secret = *secret;
  auto server = Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  WorkerOptions worker;  // the default first-connect timeout (10 s)
  worker.server_address = (*server)->address();
  worker.secret = *secret;
  WorkerHostOptions host_options;
  host_options.standalone = false;
  WorkerHost host(worker, host_options);
  Registrations seen;
  absl::Notification ended;
  absl::Status end;
  std::thread run([&] {
    end = host.Run([&](const Worker& w) { seen.Add(w); });
    ended.Notify();
  });
  ASSERT_TRUE(seen.AwaitCount(1, absl::Seconds(30)));
  ASSERT_TRUE((*server)->WaitForWorkers(1, absl::Seconds(30)).ok());
  const absl::Time t0 = absl::Now();
  server->reset();  // ends every session; nothing listens any more
  // Its one rejoin attempt finds no server: it ends within the embedded
  // rejoin timeout (2 s), not the first connect's 10 s (before: 10.0 s).
  const bool in_time = ended.WaitForNotificationWithTimeout(absl::Seconds(5));
  if (!in_time) host.Shutdown();
  run.join();
  EXPECT_TRUE(in_time) << "ended after " << absl::Now() - t0;
  EXPECT_FALSE(end.ok());
  EXPECT_EQ(seen.generations().size(), 1u);
}

TEST(WorkerHostTest, AStandaloneWorkerGivesUpWhenTheBackOffDoes) {
  auto secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  WorkerOptions worker;
  worker.server_address = "127.0.0.1:1";  // nothing listens there
  worker.connect_timeout = absl::Milliseconds(100);
  worker.secret = *secret;
  WorkerHostOptions host_options;
  host_options.backoff = {.initial = absl::Milliseconds(1),
                          .multiplier = 2,
                          .cap = absl::Milliseconds(10),
                          .give_up_after = absl::Milliseconds(50)};
  WorkerHost host(worker, host_options);
  absl::Status end = host.Run([](const Worker&) {});
  EXPECT_TRUE(absl::IsUnavailable(end)) << end;
}

}  // namespace
}  // namespace plexus
