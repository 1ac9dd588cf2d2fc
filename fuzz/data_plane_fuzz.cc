// Fuzz target: data-plane frames as a worker receives them. The bytes go
// over a real connection (unix socket or TCP) to a real DataPlaneServer,
// whose connection thread reads them (FrameSocket::ReadHeader, ReadShard,
// ReadMessage, ReadIpc) and serves them (PUT, PUSH, PUSH_ERROR, PUSH_IPC,
// FETCH, WAIT) on a real worker (worker_harness.h): WorkerImpl as the
// handler, its object store behind it. Ops applied first declare what the
// frames may touch.
//
// Input:
//   u8    flags: 1 unix socket (else TCP); 2 a memfd rides on the first
//         byte; 4 the memfd is sealed against shrinking; 8 no handshake:
//         the bytes are the first thing sent (refused) (else the harness
//         opens the connection with a valid handshake, as a worker with
//         flag 16, else as the client the first frame's buffer id names)
//   u32   the memfd's size in bytes (mod 1 MiB), only with flag 2
//   u16 + bytes  one serialized ServerToWorker, applied first (declares,
//         expects, ...); empty or unparsable: none
//   rest  the bytes sent; then the sender shuts its side down and reads
//         every reply until the worker closes the connection.
// A request left waiting (for a shard nothing will produce) is ended the
// way the server ends it, by failing its buffer; a connection the worker
// has not closed 10 s after that is reported as a hang.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/worker_harness.h"
#include "google/protobuf/stubs/logging.h"
#include "plexus/store/object_store.h"
#include "plexus/transport/data_plane.h"
#include "plexus/transport/internal/frame_socket.h"
#include "plexus/transport/internal/handshake.h"
#include "spdlog/spdlog.h"

namespace plexus::fuzz {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "data_plane_fuzz: %s\n", what.c_str());
  std::abort();
}

// Forwards to the worker of the current input, and knows which buffers
// have requests waiting in it.
class WatchedHandler : public transport::DataPlaneHandler {
 public:
  void set_target(transport::DataPlaneHandler* target) {
    absl::MutexLock lock(&mu_);
    target_ = target;
  }
  std::set<uint64_t> waiting() {
    absl::MutexLock lock(&mu_);
    return std::set<uint64_t>(waiting_.begin(), waiting_.end());
  }

  // The worker's own checks, enforced: the harness opens the connection
  // with a valid handshake unless the input asks for none, so the fuzzer
  // reaches both the code behind the checks and their refusals.
  absl::StatusOr<Credential> CredentialFor(
      const transport::DataPlanePeer& peer) override {
    return target()->CredentialFor(peer);
  }
  absl::Status Authorize(transport::DataPlaneRequest request,
                         const transport::ShardKey& key,
                         const transport::DataPlanePeer& peer) override {
    return target()->Authorize(request, key, peer);
  }
  absl::Status AdmitIncoming(const transport::ShardKey& key, size_t bytes,
                             bool from_client) override {
    Watch watch(this, key);
    return target()->AdmitIncoming(key, bytes, from_client);
  }
  absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(
      const transport::ShardKey& key, size_t bytes, bool from_client) override {
    return target()->AllocateIncoming(key, bytes, from_client);
  }
  absl::Status Deliver(const transport::ShardKey& key,
                       std::shared_ptr<Storage> data,
                       bool from_client) override {
    return target()->Deliver(key, std::move(data), from_client);
  }
  void DeliverError(const transport::ShardKey& key,
                    const absl::Status& error) override {
    target()->DeliverError(key, error);
  }
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const transport::ShardKey& key) override {
    Watch watch(this, key);
    return target()->AwaitReady(key);
  }
  bool OpensCudaIpc() override { return target()->OpensCudaIpc(); }
  absl::Status ReceiveIpc(const transport::ShardKey& key,
                          const transport::IpcShard& shard) override {
    Watch watch(this, key);
    return target()->ReceiveIpc(key, shard);
  }

 private:
  struct Watch {
    Watch(WatchedHandler* h, const transport::ShardKey& key)
        : h(h), id(key.buffer_id) {
      absl::MutexLock lock(&h->mu_);
      h->waiting_.insert(id);
    }
    ~Watch() {
      absl::MutexLock lock(&h->mu_);
      h->waiting_.erase(h->waiting_.find(id));
    }
    WatchedHandler* h;
    uint64_t id;
  };
  transport::DataPlaneHandler* target() {
    absl::MutexLock lock(&mu_);
    if (target_ == nullptr) Die("a handler call outside any input");
    return target_;
  }

  absl::Mutex mu_;
  transport::DataPlaneHandler* target_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::multiset<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
};

// A data-plane server of its own per input, serving one worker: when it is
// destroyed, every connection thread has returned (the worker may still be
// told of a shard after the connection closed).
struct Harness {
  explicit Harness(WorkerImpl* worker) {
    handler.set_target(&worker->data_plane());
    static int count = 0;
    transport::DataPlaneServerOptions options;
    options.unix_name = absl::StrCat("plexus-fuzz-dp-", getpid(), "-", count++);
    auto started = transport::DataPlaneServer::Start(options, &handler,
                                                     /*counters=*/nullptr);
    if (!started.ok()) Die(started.status().ToString());
    server = *std::move(started);
    const std::string address = server->tcp_address();
    if (!absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &tcp_port)) {
      Die("tcp address " + address);
    }
  }

  WatchedHandler handler;
  std::unique_ptr<transport::DataPlaneServer> server;
  int tcp_port = 0;
};

int Connect(Harness& h, bool unix_socket) {
  int fd = socket(unix_socket ? AF_UNIX : AF_INET,
                  SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) Die(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_storage storage{};
  socklen_t len;
  if (unix_socket) {
    auto* addr = reinterpret_cast<sockaddr_un*>(&storage);
    addr->sun_family = AF_UNIX;
    const std::string& name = h.server->unix_path();
    std::memcpy(addr->sun_path + 1, name.data(), name.size());
    len = offsetof(sockaddr_un, sun_path) + 1 + name.size();
  } else {
    // Reset on close: no TIME_WAIT left per input.
    linger no_linger{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_linger, sizeof(no_linger));
    auto* addr = reinterpret_cast<sockaddr_in*>(&storage);
    addr->sin_family = AF_INET;
    addr->sin_port = htons(static_cast<uint16_t>(h.tcp_port));
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(sockaddr_in);
  }
  // Non-blocking: a signal (libFuzzer's timer) or a full backlog retries.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (connect(fd, reinterpret_cast<sockaddr*>(&storage), len) != 0) {
    if (errno == EISCONN) break;
    if (errno != EINPROGRESS && errno != EALREADY && errno != EINTR &&
        errno != EAGAIN) {
      Die(absl::StrCat("connect: ", strerror(errno)));
    }
    if (absl::Now() > deadline) Die("connect: no answer for 10 s");
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 1);
    int error = 0;
    socklen_t error_len = sizeof(error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_len);
    if (error != 0) Die(absl::StrCat("connect: ", strerror(error)));
  }
  return fd;
}

// Reads what is there; closes descriptors that came with it (a DATA reply
// on a unix socket carries a memfd). False at the end of the stream.
bool Drain(int fd) {
  char buf[1 << 16];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  while (true) {
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < fds; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        close(passed);
      }
    }
    if (n > 0) continue;
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    return false;  // reset by the worker: also an end
  }
}

// The first bytes, with a memfd riding on them.
ssize_t SendWithFd(int fd, const std::string& bytes, int memfd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &memfd, sizeof(int));
  return sendmsg(fd, &msg, MSG_NOSIGNAL);
}

// Fails the buffers of every request waiting in the worker, as the server
// does when their producer is gone.
void EndWaits(WorkerImpl& worker, const std::set<uint64_t>& buffers) {
  proto::ServerToWorker msg;
  proto::WorkerOp* op = msg.add_ops();
  for (uint64_t id : buffers) op->mutable_fail()->add_buffer_ids(id);
  op->mutable_fail()->mutable_status()->set_code(
      static_cast<int>(absl::StatusCode::kAborted));
  op->mutable_fail()->mutable_status()->set_message(
      "data_plane_fuzz: ended the wait");
  worker.ApplyOps(msg);
}

void Handshake(int fd, bool unix_socket,
               const transport::DataPlaneIdentity& me);

void Exchange(Harness& h, WorkerImpl& worker, bool unix_socket, int memfd,
              const std::string& bytes,
              const std::optional<transport::DataPlaneIdentity>& me) {
  int fd = Connect(h, unix_socket);
  if (me.has_value()) Handshake(fd, unix_socket, *me);
  size_t sent = 0;
  if (memfd >= 0 && !bytes.empty()) {
    std::string first = bytes.substr(0, 64);
    ssize_t n = SendWithFd(fd, first, memfd);
    if (n > 0) sent = static_cast<size_t>(n);
  }
  bool open = true;
  bool write_open = true;
  absl::Time deadline = absl::InfiniteFuture();
  while (open) {
    if (write_open && sent == bytes.size()) {
      shutdown(fd, SHUT_WR);
      write_open = false;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    int ready = poll(&p, 1, 1);
    if (ready < 0 && errno != EINTR)
      Die(absl::StrCat("poll: ", strerror(errno)));
    if (ready > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      open = Drain(fd);
    }
    if (ready > 0 && write_open && (p.revents & POLLOUT)) {
      ssize_t n =
          send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        write_open = false;  // the worker closed the connection
      }
    }
    if (ready == 0) {
      // Nothing moved for a millisecond: a request may be waiting.
      std::set<uint64_t> waiting = h.handler.waiting();
      if (!waiting.empty()) {
        EndWaits(worker, waiting);
        if (deadline == absl::InfiniteFuture()) {
          deadline = absl::Now() + absl::Seconds(10);
        }
      }
      if (absl::Now() > deadline) {
        Die("a connection still open 10 s after its waits were ended");
      }
    }
  }
  close(fd);
}

// The cluster secret of every worker this target starts.
const ClusterSecret& Secret() {
  static const ClusterSecret* secret = [] {
    absl::StatusOr<ClusterSecret> s = ClusterSecret::Generate();
    if (!s.ok()) Die(s.status().ToString());
    return new ClusterSecret(*s);
  }();
  return *secret;
}

// Who the harness says it is in the handshake: a worker (flag 16), else
// the client that the first frame's buffer id names.
transport::DataPlaneIdentity IdentityFor(const std::string& bytes,
                                         bool worker) {
  transport::DataPlaneIdentity me;
  if (worker) {
    me.peer = {CredentialRole::kWorker, 0};
  } else {
    transport::internal::FrameHeader h;
    if (bytes.size() >= sizeof(h)) std::memcpy(&h, bytes.data(), sizeof(h));
    me.peer = {CredentialRole::kClient, ClientOfBuffer(h.buffer_id)};
  }
  me.credential = Secret().Derive(me.peer.role, me.peer.id);
  return me;
}

// Runs the connector's side of the handshake on the connection `fd`
// (non-blocking; made blocking for the handshake only).
void Handshake(int fd, bool unix_socket,
               const transport::DataPlaneIdentity& me) {
  const int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  transport::internal::FrameSocket socket(
      transport::internal::UniqueFd(dup(fd)), unix_socket);
  absl::Status s = transport::internal::ConnectHandshake(socket, me);
  if (!s.ok()) Die(absl::StrCat("handshake: ", s.ToString()));
  fcntl(fd, F_SETFL, fl);
}

int MakeMemfd(uint32_t bytes, bool seal) {
  int fd = memfd_create("plexus-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) Die(absl::StrCat("memfd_create: ", strerror(errno)));
  if (ftruncate(fd, bytes) != 0) Die("ftruncate");
  if (seal) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

}  // namespace
}  // namespace plexus::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 notes
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace plexus;
  using namespace plexus::fuzz;
  InputReader in(data, size);
  const uint8_t flags = in.U8();
  const bool unix_socket = flags & 1;
  int memfd = -1;
  if (flags & 2) {
    const uint32_t bytes = in.U32() % (1 << 20);
    if (unix_socket) memfd = MakeMemfd(bytes, flags & 4);
  }
  proto::ServerToWorker ops;
  const bool have_ops = ops.ParseFromString(in.Record());
  std::string bytes = in.Rest();
  std::optional<transport::DataPlaneIdentity> me;
  if ((flags & 8) == 0) me = IdentityFor(bytes, flags & 16);

  std::unique_ptr<WorkerImpl> worker = StartWorker(&Secret());
  if (have_ops) {
    DisarmPeers(ops);
    worker->ApplyOps(ops);
  }
  {
    Harness h(worker.get());
    Exchange(h, *worker, unix_socket, memfd, bytes, me);
  }
  if (memfd >= 0) close(memfd);
  WaitForDevices(*worker, absl::Milliseconds(20));
  worker.reset();
  return 0;
}
