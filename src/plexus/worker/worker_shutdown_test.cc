// A worker destroyed while a transfer waits for a call still queued on its
// devices: the server, two workers and a client, all in this process.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/client/client.h"
#include "plexus/server/server.h"
#include "plexus/worker/worker.h"

namespace plexus {
namespace {

// ~WorkerImpl used to destroy its peer senders before its devices, whose
// drained tasks then failed their outputs and ran the transfer callbacks,
// which hold raw PeerSender pointers: a use after free on every worker that
// stopped with a transfer pending (AddressSanitizer reports it; without it,
// the freed sender could still push the failure to the peer). Now the
// senders stop first, live until the devices have drained, and the peer's
// consumer fails because the worker is gone.
TEST(WorkerShutdownTest, TransferPendingOnAQueuedCallWhenTheWorkerIsDestroyed) {
  auto server = Server::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  auto a = Worker::Start({.server_address = address,
                          .host_name = "host-a",
                          .num_devices = 2,
                          .device_memory = 64 << 20,
                          .secret = (*server)->secret()});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Worker::Start({.server_address = address,
                          .host_name = "host-b",
                          .num_devices = 1,
                          .device_memory = 64 << 20,
                          .secret = (*server)->secret()});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*server)->WaitForWorkers(2, absl::Seconds(30)).ok());
  auto client = Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  Client& c = **client;

  // Slices: device 0 of worker a, worker b, device 1 of worker a.
  auto on_a =
      c.CreateSlice({.num_devices = 1, .placement = Placement::kOneHost});
  auto on_b =
      c.CreateSlice({.num_devices = 1, .placement = Placement::kOneHost});
  auto also_a =
      c.CreateSlice({.num_devices = 1, .placement = Placement::kOneHost});
  ASSERT_TRUE(on_a.ok() && on_b.ok() && also_a.ok());
  const int64_t worker_a = (*a)->worker_id();
  ASSERT_EQ((*on_a)->info().devices(0).worker_id(), worker_a);
  ASSERT_EQ((*on_b)->info().devices(0).worker_id(), (*b)->worker_id());
  ASSERT_EQ((*also_a)->info().devices(0).worker_id(), worker_a);
  ASSERT_NE((*also_a)->info().devices(0).device(),
            (*on_a)->info().devices(0).device());

  // About a second of calls queued on worker a's first device, and a
  // consumer on worker b: worker a holds a transfer of the last result,
  // waiting for it.
  ArgSpec arg{{DType::kF32, {4}}, Sharding::Replicated()};
  std::vector<float> x = {1, 2, 3, 4};
  auto fx = c.Put(*on_a, x.data(), arg);
  ASSERT_TRUE(fx.ok()) << fx.status();
  auto busy = c.Compile(*on_a, "busy", "busy_wait", {{"micros", 20000}}, {arg});
  ASSERT_TRUE(busy.ok()) << busy.status();
  Future y = *fx;
  for (int i = 0; i < 50; ++i) y = (*c.Call(**busy, {y}))[0];
  auto twice = c.Compile(*on_b, "twice", "scale", {{"factor", 2.0}}, {arg});
  ASSERT_TRUE(twice.ok()) << twice.status();
  Future z = (*c.Call(**twice, {y}))[0];
  // A call on worker a's other device, sent after the transfer: once it has
  // computed, worker a has applied the transfer (ops apply in stream order).
  auto fm = c.Put(*also_a, x.data(), arg);
  ASSERT_TRUE(fm.ok()) << fm.status();
  auto copy = c.Compile(*also_a, "copy", "scale", {{"factor", 1.0}}, {arg});
  ASSERT_TRUE(copy.ok()) << copy.status();
  Future marker = (*c.Call(**copy, {*fm}))[0];
  ASSERT_TRUE(c.Wait(marker).ok());

  a->reset();  // with the chain still queued: its tasks drain as failures

  // Either the drained transfer reaches worker b first (UNAVAILABLE) or
  // the server, which has no spare to restore on_a, fails z as lost
  // (DATA_LOSS); either way it names the lost connection.
  absl::Status consumer = c.Wait(z);
  EXPECT_TRUE(absl::IsUnavailable(consumer) || absl::IsDataLoss(consumer))
      << consumer;
  EXPECT_NE(consumer.message().find("lost its connection"), std::string::npos)
      << consumer;
  client->reset();
  b->reset();
  server->reset();
}

}  // namespace
}  // namespace plexus
