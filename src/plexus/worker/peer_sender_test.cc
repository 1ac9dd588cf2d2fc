#include "plexus/worker/peer_sender.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "plexus/transport/internal/socket_io.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus {
namespace {

using transport::ShardKey;
using transport::test_support::kDeadline;
using transport::test_support::MapHandler;
using transport::test_support::Pattern;
using transport::test_support::SameBytes;
using transport::test_support::UniqueUnixName;

// What a PeerSender reported as undeliverable.
class Failures {
 public:
  PeerSender::FailureCallback Callback() {
    return [this](const ShardKey& key, const absl::Status& reason) {
      absl::MutexLock lock(&mu_);
      keys_.push_back(key);
      reasons_.push_back(reason);
    };
  }
  // The first report, once there is one (within kDeadline).
  bool Await(ShardKey* key, absl::Status* reason) {
    absl::MutexLock lock(&mu_);
    auto some = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !keys_.empty();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&some), kDeadline)) return false;
    *key = keys_.front();
    *reason = reasons_.front();
    return true;
  }

 private:
  absl::Mutex mu_;
  std::vector<ShardKey> keys_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> reasons_ ABSL_GUARDED_BY(mu_);
};

// A stopped peer: the kernel completes the connection, the worker never
// sends its challenge. Once the peer is declared down, the sender stops
// connecting at once (it used to sit out the handshake's 10 s, and a
// worker shutting down waited on it).
TEST(PeerSenderTest, StopsConnectingToAPeerDeclaredDown) {
  std::string address;
  auto listener = transport::internal::ListenTcp("127.0.0.1", &address);
  ASSERT_TRUE(listener.ok());
  Failures failures;
  auto sender = std::make_unique<PeerSender>(2, address, "", nullptr,
                                             transport::DataPlaneIdentity{},
                                             failures.Callback());
  // Large: queued for the sender's thread, which connects.
  sender->Send({41, 0}, std::shared_ptr<const Storage>(Pattern(256 << 10, 5)));
  // The connection arrives: the sender now waits for a challenge.
  auto accepted = transport::internal::Accept(listener->get());
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  const absl::Time start = absl::Now();
  sender->MarkDown();
  sender.reset();  // joins its thread
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(2)) << "the sender sat out the handshake";
}

// A peer in another network namespace: its unix socket is not reachable
// from here, its TCP address is. The shard arrives over TCP.
TEST(PeerSenderTest, DeliversOverTcpWhenThePeersUnixSocketIsUnreachable) {
  MapHandler handler;
  auto server = transport::DataPlaneServer::Start({}, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  Failures failures;
  {
    PeerSender sender(2, (*server)->tcp_address(),
                      UniqueUnixName() + "-elsewhere", nullptr, {},
                      failures.Callback());
    std::shared_ptr<Storage> sent = Pattern(256 << 10, 5);
    sender.Send({41, 0}, std::shared_ptr<const Storage>(sent));
    absl::Status error;
    std::shared_ptr<Storage> got = handler.WaitFor({41, 0}, &error);
    ASSERT_NE(got, nullptr) << error;
    EXPECT_TRUE(SameBytes(*got, *sent));
  }
  handler.Close();
}

// A peer that cannot be reached at all: the shard is reported, with the
// reason, instead of being dropped with a log line.
TEST(PeerSenderTest, ReportsAShardItCannotDeliver) {
  std::string address;
  {
    MapHandler handler;
    auto server = transport::DataPlaneServer::Start({}, &handler, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    address = (*server)->tcp_address();  // closed below: nobody listens
    handler.Close();
  }
  Failures failures;
  PeerSender sender(7, address, UniqueUnixName() + "-elsewhere", nullptr, {},
                    failures.Callback());
  sender.Send({42, 3}, std::shared_ptr<const Storage>(Pattern(1024, 1)));
  ShardKey key;
  absl::Status reason;
  ASSERT_TRUE(failures.Await(&key, &reason)) << "no failure was reported";
  EXPECT_EQ(key, (ShardKey{42, 3}));
  EXPECT_EQ(reason.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(reason.message().find("buffer 42 shard 3 to worker 7"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.message().find(address), std::string::npos) << reason;
}

// A value in GPU memory (as the CUDA plugin's buffers say) to a peer of
// this host that offers CUDA IPC, from a worker that cannot make the CUDA
// calls (no CUDA here): staged through host memory, the bytes intact,
// counted as host-staged and never as IPC.
TEST(PeerSenderTest, AGpuValueGoesHostStagedWhereCudaIpcIsNotPossible) {
  class GpuBuffer : public DeviceBuffer {
   public:
    explicit GpuBuffer(std::shared_ptr<Storage> bytes)
        : bytes_(std::move(bytes)) {}
    size_t size() const override { return bytes_->size(); }
    absl::Status Await() const override { return absl::OkStatus(); }
    const void* host_address() const override { return nullptr; }
    absl::Status CopyToHost(void* dst) const override {
      std::memcpy(dst, bytes_->data(), bytes_->size());
      return absl::OkStatus();
    }
    bool in_gpu_memory() const override { return true; }

   private:
    std::shared_ptr<Storage> bytes_;
  };
  class OffersIpc : public MapHandler {
   public:
    bool OpensCudaIpc() override { return true; }
    absl::Status ReceiveIpc(const ShardKey&,
                            const transport::IpcShard&) override {
      ipc_calls++;
      return absl::OkStatus();
    }
    std::atomic<int> ipc_calls{0};
  };
  OffersIpc handler;
  transport::DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = transport::DataPlaneServer::Start(options, &handler, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<CudaIpc> no_cuda =
      CudaIpc::Off(absl::UnavailableError("no CUDA runtime in this test"));
  const int64_t staged = TransferPaths::host_staged().load();
  const int64_t ipc = TransferPaths::ipc().load();
  Failures failures;
  {
    PeerSender sender(2, (*server)->tcp_address(), options.unix_name, nullptr,
                      {}, failures.Callback(), no_cuda.get());
    std::shared_ptr<Storage> sent = Pattern(512 << 10, 3);
    sender.Send({44, 0}, std::shared_ptr<const Storage>(Storage::OnDevice(
                             std::make_shared<GpuBuffer>(sent))));
    absl::Status error;
    std::shared_ptr<Storage> got = handler.WaitFor({44, 0}, &error);
    ASSERT_NE(got, nullptr) << error;
    EXPECT_TRUE(SameBytes(*got, *sent));
  }
  EXPECT_EQ(TransferPaths::host_staged().load(), staged + 1);
  EXPECT_EQ(TransferPaths::ipc().load(), ipc);
  EXPECT_EQ(handler.ipc_calls.load(), 0);
  handler.Close();
}

// A shard that had failed upstream and cannot be delivered either: what the
// destination must learn is the upstream error, code and message, as the
// PUSH_ERROR would have said it.
TEST(PeerSenderTest, ReportsTheUpstreamErrorOfAFailedShard) {
  Failures failures;
  PeerSender sender(7, "127.0.0.1:1", "", nullptr, {}, failures.Callback());
  const absl::Status upstream =
      absl::InvalidArgumentError("program 'check' failed: nan at index 2");
  sender.Send({43, 0}, upstream);
  ShardKey key;
  absl::Status reason;
  ASSERT_TRUE(failures.Await(&key, &reason)) << "no failure was reported";
  EXPECT_EQ(key, (ShardKey{43, 0}));
  EXPECT_EQ(reason, upstream);
}

}  // namespace
}  // namespace plexus
