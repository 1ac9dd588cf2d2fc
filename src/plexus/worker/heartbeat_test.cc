// A worker that is alive but busy is never declared down: its heartbeats
// go out while its object store's lock is held for longer than the
// failure deadline, and the server takes a heartbeat as it arrives, even
// while its state lock is held. Server, worker and client in this
// process, over real sockets; the server's deadline is its default (1 s).
#include <memory>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/client/client.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/common/protocol.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/server.h"
#include "plexus/worker/worker.h"

namespace plexus {
namespace {

// `base`'s time, except that once closed, the next read blocks until the
// gate opens, holding whatever locks its reader holds: a store whose
// admission of a put reads it holds its lock that long, and so does a
// server's liveness check (the state lock). Counts the reads.
class GateClock : public Clock {
 public:
  explicit GateClock(Clock* base) : base_(base) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    if (closed_ && !held_) {
      held_ = true;
      mu_.Await(absl::Condition(
          +[](bool* closed) { return !*closed; }, &closed_));
    }
    // Counted once the time is taken: a test that waits for a read and
    // then moves the time knows which time that read saw.
    const absl::Time now = base_->Now();
    ++reads_;
    return now;
  }
  bool AwaitWithDeadline(absl::Mutex* mu, absl::CondVar* cv,
                         absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return base_->AwaitWithDeadline(mu, cv, deadline);
  }
  void SleepFor(absl::Duration d) override { base_->SleepFor(d); }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    closed_ = false;
  }
  // Waits (really, at most `timeout`) until a reader is held at the gate.
  bool AwaitHeld(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&held_), timeout);
  }
  int64_t reads() const {
    absl::MutexLock lock(&mu_);
    return reads_;
  }
  // Waits (really, at most `timeout`) until the clock has been read `n`
  // times in all.
  bool AwaitReads(int64_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reads_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  Clock* const base_;
  mutable absl::Mutex mu_;
  mutable bool closed_ ABSL_GUARDED_BY(mu_) = false;
  mutable bool held_ ABSL_GUARDED_BY(mu_) = false;
  mutable int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(HeartbeatTest, AWorkerWhoseStoreLockIsHeldPastTheDeadlineStaysAlive) {
  auto server = Server::Start({});  // failure deadline 1 s
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  GateClock gate(Clock::Real());
  auto worker = Worker::Start({.server_address = address,
                               .host_name = "busy",
                               .device_memory = 64 << 20,
                               .clock = &gate,
                               .secret = (*server)->secret()});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*server)->WaitForWorkers(1, absl::Seconds(30)).ok());
  auto client = Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto slice = (*client)->CreateSlice({.num_devices = 1});
  ASSERT_TRUE(slice.ok()) << slice.status();

  // A put whose admission, under the store's lock, waits at the gate.
  gate.Close();
  const ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  const std::vector<float> x = {1, 2, 3, 4};
  absl::StatusOr<Future> put = absl::UnknownError("not put");
  std::thread putter([&] { put = (*client)->Put(*slice, x.data(), arg); });
  absl::Cleanup join = [&] {  // also when an assertion below fails
    gate.Open();
    putter.join();
  };
  ASSERT_TRUE(gate.AwaitHeld(absl::Seconds(30)))
      << "the put never reached the store";
  const absl::Time held_at = absl::Now();

  // One and a half deadlines with the lock held: each status waits for a
  // heartbeat of every live worker sent after it was asked for, and the
  // worker is alive in every one.
  auto stub = proto::Controller::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  int statuses = 0;
  while (absl::Now() - held_at < absl::Milliseconds(1500)) {
    grpc::ClientContext ctx;
    proto::StatusRequest request;
    request.set_fresh_timeout_ms(2000);
    proto::ClusterStatus status;
    ASSERT_TRUE(stub->GetStatus(&ctx, request, &status).ok());
    ASSERT_EQ(status.workers_size(), 1);
    ASSERT_TRUE(status.workers(0).alive())
        << "declared down after " << absl::FormatDuration(absl::Now() - held_at)
        << " with its store lock held: " << status.workers(0).down_reason();
    ++statuses;
  }
  // Heartbeats came all along, not once at the end (held back, the first
  // status would have waited out the 1.5 s). Fewer than the 15 a quiet
  // machine answers: a sanitizer build on a loaded one is slower.
  EXPECT_GE(statuses, 3);

  // The lock goes: the put completes, and the value is there.
  std::move(join).Invoke();
  ASSERT_TRUE(put.ok()) << put.status();
  std::vector<float> back(4);
  ASSERT_TRUE((*client)->Fetch(*put, back.data()).ok());
  EXPECT_EQ(back, x);
  client->reset();
  worker->reset();
  server->reset();
}

// The server's side: a heartbeat read while the state lock is held (here
// by a liveness check, held at the clock it reads under that lock) counts
// from when it was read, not from when the lock was free again: the check
// that held the lock does not find the worker silent.
TEST(HeartbeatTest, AHeartbeatReadWhileTheStateLockIsHeldCountsAtOnce) {
  FakeClock time(absl::FromUnixSeconds(1000));
  GateClock gate(&time);
  ServerOptions options;
  options.clock = &gate;
  options.liveness_check_period = absl::Hours(1);  // only this test checks
  auto server = Server::Start(options);            // failure deadline 1 s
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = proto::Controller::NewStub(grpc::CreateChannel(
      (*server)->address(), grpc::InsecureChannelCredentials()));
  auto alive = [&] {
    grpc::ClientContext ctx;
    proto::ClusterStatus status;
    EXPECT_TRUE(stub->GetStatus(&ctx, {}, &status).ok());
    EXPECT_EQ(status.workers_size(), 1);
    return status.workers_size() == 1 && status.workers(0).alive();
  };

  // A worker on a raw stream: registered at 1000 s, heard from then.
  grpc::ClientContext session;
  auto stream = stub->WorkerSession(&session);
  proto::WorkerToServer hello;
  auto* reg = hello.mutable_register_();
  reg->set_host_name("raw");
  reg->add_devices()->set_memory_bytes(1 << 20);
  reg->set_data_address("127.0.0.1:1");
  const Credential credential =
      (*server)->secret().Derive(CredentialRole::kWorker);
  reg->set_credential(std::string(credential.begin(), credential.end()));
  reg->set_protocol_version(kProtocolVersion);
  ASSERT_TRUE(stream->Write(hello));
  proto::ServerToWorker first;
  ASSERT_TRUE(stream->Read(&first));
  // Registered all through (the status waits for the state lock it took):
  // from here the check below is the server's only reader of the clock
  // until the heartbeat comes.
  ASSERT_TRUE(alive());
  absl::Cleanup end_session = [&] {
    session.TryCancel();
    proto::ServerToWorker rest;
    while (stream->Read(&rest)) {
    }
    stream->Finish().IgnoreError();
  };

  // At 1000.8 s a liveness check holds the state lock; a heartbeat comes
  // meanwhile, and the check goes on at 1001.3 s.
  time.Advance(absl::Milliseconds(800));
  gate.Close();
  std::thread check([&] { (*server)->CheckLiveness(); });
  absl::Cleanup join = [&] {
    gate.Open();
    check.join();
  };
  ASSERT_TRUE(gate.AwaitHeld(absl::Seconds(30)));
  const int64_t reads = gate.reads();
  proto::WorkerToServer beat;
  beat.mutable_heartbeat();
  ASSERT_TRUE(stream->Write(beat));
  // Its reader reads the clock as the heartbeat arrives; it used to wait
  // for the state lock first.
  ASSERT_TRUE(gate.AwaitReads(reads + 1, absl::Seconds(10)))
      << "the heartbeat was not taken while the state lock was held";
  time.Advance(absl::Milliseconds(500));
  std::move(join).Invoke();
  EXPECT_TRUE(alive()) << "declared down by a check that held the lock "
                          "while its heartbeat waited";

  // Silent from then on: declared down by the first check after its
  // reader has handled the heartbeat (until then it counts as heard; the
  // reader waits for the state lock, which these checks and statuses also
  // take, so it may take it only after a few of them).
  for (int i = 0; i < 100 && alive(); ++i) {
    time.Advance(absl::Seconds(1));
    (*server)->CheckLiveness();
  }
  EXPECT_FALSE(alive());
}

}  // namespace
}  // namespace plexus
