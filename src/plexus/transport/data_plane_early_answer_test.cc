// A FETCH or WAIT answered by the thread that readies its shard
// (DataPlaneHandler::AwaitReadyTelling, the early answer in
// data_plane_server.cc): the hook's send, its hand-back to the
// connection's thread, and values in device memory.
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "plexus/common/ids.h"
#include "plexus/store/device_buffer.h"
#include "plexus/store/storage.h"
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

// A handler whose wait blocks until the test releases it, handing its hook
// to the test: the test plays the thread that readies the shard.
class HookingHandler : public MapHandler {
 public:
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReadyTelling(
      const ShardKey& key, const ReadyHook& on_ready) override {
    absl::MutexLock lock(&hook_mu_);
    hook_ = on_ready;
    hooked_ = true;
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hook_mu_) {
      return released_;
    };
    hook_mu_.Await(absl::Condition(&released));
    released_ = false;
    hooked_ = false;
    return value_;
  }
  // The hook of the wait under way, once there is one.
  ReadyHook AwaitHook() {
    absl::MutexLock lock(&hook_mu_);
    auto hooked = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hook_mu_) {
      return hooked_;
    };
    hook_mu_.AwaitWithTimeout(absl::Condition(&hooked), kDeadline);
    return hook_;
  }
  // Lets the wait return `value`, and waits until it did (so that the
  // next AwaitHook sees the next wait's hook, not this one's).
  void Release(std::shared_ptr<const Storage> value) {
    absl::MutexLock lock(&hook_mu_);
    value_ = std::move(value);
    released_ = true;
    auto returned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hook_mu_) {
      return !hooked_;
    };
    hook_mu_.AwaitWithTimeout(absl::Condition(&returned), kDeadline);
  }

 private:
  absl::Mutex hook_mu_;
  ReadyHook hook_ ABSL_GUARDED_BY(hook_mu_);
  bool hooked_ ABSL_GUARDED_BY(hook_mu_) = false;
  bool released_ ABSL_GUARDED_BY(hook_mu_) = false;
  std::shared_ptr<const Storage> value_ ABSL_GUARDED_BY(hook_mu_);
};

// A value in a device's memory that is the host's (as the CPU plugin's),
// computed or still computing (Computed says none; Await never blocks
// here: the test finishes it before the connection's thread reads it).
class HostDeviceBuffer : public DeviceBuffer {
 public:
  HostDeviceBuffer(size_t n, char byte, bool computed)
      : bytes_(n, byte), computed_(computed) {}
  size_t size() const override { return bytes_.size(); }
  absl::Status Await() const override {
    computed_ = true;
    return absl::OkStatus();
  }
  std::optional<absl::Status> Computed() const override {
    if (!computed_) return std::nullopt;
    return absl::OkStatus();
  }
  const void* host_address() const override {
    return computed_ ? bytes_.data() : nullptr;
  }
  absl::Status CopyToHost(void* dst) const override {
    std::memcpy(dst, bytes_.data(), bytes_.size());
    return absl::OkStatus();
  }

 private:
  std::string bytes_;
  mutable std::atomic<bool> computed_;
};

std::shared_ptr<const Storage> OnDevice(size_t n, char byte, bool computed) {
  return Storage::OnDevice(
      std::make_shared<HostDeviceBuffer>(n, byte, computed));
}

// A FETCH or WAIT whose shard is readied while it waits is answered by the
// readying thread, while the connection's thread still waits (the client
// has it before the handler's wait returns), once: the connection's next
// answer is its own. A value too large to send that way waits for the
// connection's thread. Over either carrier.
TEST(DataPlaneServerTest, AnAnswerIsSentByTheThreadThatReadiesItsShard) {
  HookingHandler handler;
  DataPlaneCounters counters;
  DataPlaneServerOptions options;
  options.unix_name = UniqueUnixName();
  auto server = DataPlaneServer::Start(options, &handler, &counters);
  ASSERT_TRUE(server.ok()) << server.status();
  int64_t early = 0;
  for (const std::string& unix_path : {std::string(), options.unix_name}) {
    auto conn = DataPlaneConnection::Connect(
        (*server)->tcp_address(), unix_path, nullptr, Client(1, Filled(0)));
    ASSERT_TRUE(conn.ok()) << conn.status();
    const ShardKey key{ClientMadeId(uint64_t{1}, 5), 0};
    // FETCH: the hook's send reaches the client; the handler still waits.
    absl::StatusOr<std::shared_ptr<Storage>> fetched;
    std::thread fetch([&] { fetched = (*conn)->Fetch(key); });
    handler.AwaitHook()(Valued(100, 'a'));
    fetch.join();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(std::string(static_cast<const char*>((*fetched)->data()),
                          (*fetched)->size()),
              std::string(100, 'a'));
    handler.Release(Valued(100, 'z'));  // not sent: answered already
    // WAIT: its ACK, the same way.
    absl::Status waited = absl::UnknownError("not yet");
    std::thread wait([&] { waited = (*conn)->Wait(key); });
    handler.AwaitHook()(Valued(4, 'b'));
    wait.join();
    EXPECT_TRUE(waited.ok()) << waited;
    handler.Release(Valued(4, 'z'));
    early += 2;
    // Too large for the hook: the connection's thread answers, with what
    // its own wait returned.
    std::thread large([&] { fetched = (*conn)->Fetch(key); });
    handler.AwaitHook()(
        Valued(internal::FrameSocket::kSmallFrameBytes + 1, 'c'));
    handler.Release(Valued(internal::FrameSocket::kSmallFrameBytes + 1, 'd'));
    large.join();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(static_cast<const char*>((*fetched)->data())[0], 'd');
    // In device memory: computed already (an XLA output of a run the CPU
    // plugin ended inline), read in place by the hook; still computing,
    // left to the connection's thread, which awaits it.
    absl::Notification answered;
    std::thread computed([&] {
      fetched = (*conn)->Fetch(key);
      answered.Notify();
    });
    handler.AwaitHook()(OnDevice(8, 'e', /*computed=*/true));
    EXPECT_TRUE(answered.WaitForNotificationWithTimeout(kDeadline))
        << "the hook left a computed device value to the connection's thread";
    handler.Release(Valued(8, 'z'));  // what that thread would send
    computed.join();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(std::string(static_cast<const char*>((*fetched)->data()),
                          (*fetched)->size()),
              std::string(8, 'e'));
    early += 1;
    std::thread computing([&] { fetched = (*conn)->Fetch(key); });
    handler.AwaitHook()(OnDevice(8, 'f', /*computed=*/false));
    handler.Release(OnDevice(8, 'g', /*computed=*/false));
    computing.join();
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(static_cast<const char*>((*fetched)->data())[0], 'g');
    EXPECT_EQ(counters.early_answers.load(), early);
  }
}

}  // namespace
}  // namespace plexus::transport
