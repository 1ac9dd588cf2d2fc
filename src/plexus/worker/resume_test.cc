// WorkerImpl::Resume: a worker whose server went away asks the next one to
// take it back, as the host it was. A real worker (StartLocal) and a real
// gRPC channel to an address that never answers the registration.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {
namespace {

// A TCP port that accepts connections (the kernel's backlog) and never
// speaks: a registration to it waits for its connect_timeout.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The id the last server named the worker by is what the tasks it still
// runs read (an XLA island that names it compiles there; a collective
// finds its rank by it). Resume used to set it to -1 for the whole
// registration: a program loaded meanwhile (a call the last server sent,
// read from the stream after it died) found no island naming it and
// waited kAwaitPeerCompile (30 s) for itself and its peers to compile it
// (a step of bench/server_kill.py hung 30 s after a kill).
TEST(WorkerResumeTest, AWorkerKeepsItsIdUntilTheNextServerNamesIt) {
  absl::StatusOr<ClusterSecret> secret = ClusterSecret::Generate();
  ASSERT_TRUE(secret.ok());
  SilentListener next_server;
  WorkerOptions options;
  options.num_devices = 1;
  options.device_memory = 1 << 20;
  options.secret = *secret;
  options.server_address = next_server.address();
  options.connect_timeout = absl::Milliseconds(500);
  WorkerImpl worker(options);
  ASSERT_TRUE(worker.StartLocal().ok());
  proto::ServerToWorker first;
  first.set_worker_id(5);
  worker.ApplyOps(first);
  ASSERT_EQ(worker.worker_id(), 5);

  std::atomic<bool> returned{false};
  absl::StatusOr<bool> resumed = false;
  std::thread resume([&] {
    resumed = worker.Resume(absl::Seconds(1));
    returned = true;
  });
  // Read all through the registration's wait (bounded by its timeout).
  int64_t reads = 0, other = 0;
  while (!returned.load()) {
    if (worker.worker_id() != 5) ++other;
    ++reads;
    std::this_thread::yield();
  }
  resume.join();
  EXPECT_FALSE(resumed.ok());  // nobody answered
  EXPECT_GT(reads, 0);
  EXPECT_EQ(other, 0) << "the worker's id changed in " << other << " of "
                      << reads << " reads while it asked to be taken back";
  EXPECT_EQ(worker.worker_id(), 5);

  // The next server's first message names it: another id where it did
  // not take it back (a fresh host, what it kept dropped).
  proto::ServerToWorker fresh;
  fresh.set_worker_id(9);
  fresh.set_resumed(false);
  // As after a registration that succeeded (Resume set it, then failed).
  worker.ApplyOps(fresh);
  EXPECT_EQ(worker.worker_id(), 9);
}

}  // namespace
}  // namespace plexus
