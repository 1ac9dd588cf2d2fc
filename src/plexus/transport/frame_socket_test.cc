// FrameSocket's reads: read-ahead (frames sent together cost one recv, and
// each frame's bytes are still its own), its refusal of descriptors, the
// frame timeout on a connection that reads ahead, and a reply's wait that
// sleeps until its bytes come.
#include "plexus/transport/internal/frame_socket.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "plexus/store/storage.h"
#include "plexus/transport/internal/socket_io.h"
#include "plexus/transport/internal/test_handler.h"

namespace plexus::transport::internal {
namespace {

using test_support::Pattern;
using test_support::SameBytes;

// Two ends of a unix stream socket pair, as FrameSockets.
struct Pair {
  std::unique_ptr<FrameSocket> writer;
  std::unique_ptr<FrameSocket> reader;
};

Pair UnixPair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  return {std::make_unique<FrameSocket>(UniqueFd(fds[0]), /*is_unix=*/true),
          std::make_unique<FrameSocket>(UniqueFd(fds[1]), /*is_unix=*/true)};
}

std::string Text(size_t bytes, char seed) {
  std::string s(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>(seed + i % 61);
  return s;
}

// Sends three OPS frames, a FETCH and a small PUT (bytes, no descriptor),
// then reads them back in order with `reader`, checking every byte.
void SendAndReadBack(FrameSocket& writer, FrameSocket& reader) {
  const std::string ops[3] = {Text(300, 'a'), Text(1, 'b'), Text(4000, 'c')};
  for (const std::string& o : ops) ASSERT_TRUE(writer.SendOps(o).ok());
  ASSERT_TRUE(writer.SendControl(FrameType::kFetch, ShardKey{7, 2}).ok());
  std::shared_ptr<Storage> shard = Pattern(1000, 5);  // heap: bytes follow
  ASSERT_FALSE(shard->shared());
  ASSERT_TRUE(writer.SendShard(FrameType::kPut, ShardKey{8, 0}, *shard).ok());

  bool eof = false;
  std::string got;
  for (const std::string& o : ops) {
    absl::StatusOr<FrameHeader> header = reader.ReadHeader(&eof);
    ASSERT_TRUE(header.ok()) << header.status();
    ASSERT_EQ(header->frame_type(), FrameType::kOps);
    ASSERT_TRUE(reader.ReadOps(*header, &got).ok());
    EXPECT_EQ(got, o);
  }
  absl::StatusOr<FrameHeader> fetch = reader.ReadHeader(&eof);
  ASSERT_TRUE(fetch.ok()) << fetch.status();
  EXPECT_EQ(fetch->frame_type(), FrameType::kFetch);
  EXPECT_EQ(fetch->key(), (ShardKey{7, 2}));
  absl::StatusOr<FrameHeader> put = reader.ReadHeader(&eof);
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_EQ(put->frame_type(), FrameType::kPut);
  absl::StatusOr<std::shared_ptr<Storage>> data = reader.ReadShard(
      *put, [](size_t bytes) { return Storage::Allocate(bytes); });
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(SameBytes(**data, *shard));
}

TEST(FrameSocketTest, FramesSentTogetherAreReadWithOneRecvEachKeepingItsBytes) {
  Pair reading_ahead = UnixPair();
  reading_ahead.reader->EnableReadAhead();
  SendAndReadBack(*reading_ahead.writer, *reading_ahead.reader);
  // Five frames, 5.5 KB in all, had come before the first read.
  EXPECT_EQ(reading_ahead.reader->socket_reads(), 1);

  // Without it: a read per header and one per payload.
  Pair exact = UnixPair();
  SendAndReadBack(*exact.writer, *exact.reader);
  EXPECT_EQ(exact.reader->socket_reads(), 9);
}

TEST(FrameSocketTest, AFrameLargerThanTheReadAheadIsReadWhole) {
  Pair pair = UnixPair();
  pair.reader->EnableReadAhead();
  const std::string big = Text(100 << 10, 'x');
  // Written by another thread: the socket's buffer holds less than this.
  std::thread writer([&] {
    EXPECT_TRUE(pair.writer->SendOps(big).ok());
    EXPECT_TRUE(pair.writer->SendOps("after").ok());
  });
  bool eof = false;
  std::string got;
  absl::StatusOr<FrameHeader> header = pair.reader->ReadHeader(&eof);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_TRUE(pair.reader->ReadOps(*header, &got).ok());
  EXPECT_EQ(got, big);
  header = pair.reader->ReadHeader(&eof);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_TRUE(pair.reader->ReadOps(*header, &got).ok());
  EXPECT_EQ(got, "after");
  writer.join();
  // The peer's end, between frames, is an orderly one.
  pair.writer.reset();
  header = pair.reader->ReadHeader(&eof);
  EXPECT_FALSE(header.ok());
  EXPECT_TRUE(eof);
}

TEST(FrameSocketTest, ADescriptorOnAConnectionThatReadsAheadBreaksIt) {
  Pair pair = UnixPair();
  pair.reader->EnableReadAhead();
  // At the shared-memory threshold a block is a memfd: it travels as one.
  std::shared_ptr<Storage> shard = Pattern(Storage::kShmThreshold, 1);
  ASSERT_TRUE(shard->shared());
  ASSERT_TRUE(
      pair.writer->SendShard(FrameType::kPush, ShardKey{1, 0}, *shard).ok());
  bool eof = false;
  absl::StatusOr<FrameHeader> header = pair.reader->ReadHeader(&eof);
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(header.status().message().find("takes none"), std::string::npos)
      << header.status();
  EXPECT_TRUE(pair.reader->broken());

  // Without read-ahead the same frame is a shard.
  Pair exact = UnixPair();
  ASSERT_TRUE(
      exact.writer->SendShard(FrameType::kPush, ShardKey{1, 0}, *shard).ok());
  header = exact.reader->ReadHeader(&eof);
  ASSERT_TRUE(header.ok()) << header.status();
  absl::StatusOr<std::shared_ptr<Storage>> data = exact.reader->ReadShard(
      *header, [](size_t bytes) { return Storage::Allocate(bytes); });
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(SameBytes(**data, *shard));
}

TEST(FrameSocketTest,
     AFrameStalledPartWayEndsAtTheFrameTimeoutWhenReadingAhead) {
  Pair pair = UnixPair();
  pair.reader->EnableReadAhead();
  ASSERT_TRUE(pair.reader->SetFrameTimeout(absl::Milliseconds(50)).ok());
  // A whole frame, then 20 bytes of the next header, then nothing.
  ASSERT_TRUE(pair.writer->SendOps("whole").ok());
  FrameHeader next;
  next.type = static_cast<uint16_t>(FrameType::kOps);
  ASSERT_EQ(send(pair.writer->fd(), &next, 20, MSG_NOSIGNAL), 20);
  bool eof = false;
  std::string got;
  absl::StatusOr<FrameHeader> header = pair.reader->ReadHeader(&eof);
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_TRUE(pair.reader->ReadOps(*header, &got).ok());
  EXPECT_EQ(got, "whole");
  header = pair.reader->ReadHeader(&eof);
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), absl::StatusCode::kDeadlineExceeded)
      << header.status();
  EXPECT_NE(header.status().message().find("after 20 of 64 bytes"),
            std::string::npos)
      << header.status();
  EXPECT_FALSE(eof);
}

// Line `field` of /proc/self/task/<tid>/status ("voluntary_ctxt_switches"),
// or -1.
int64_t TaskStatus(pid_t tid, const std::string& field) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::stoll(line.substr(field.size() + 1));
    }
  }
  return -1;
}

// The system call thread `tid` is in (/proc/.../syscall's first field), or
// -1 while it runs in user space.
long TaskSyscall(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
  std::string first;
  in >> first;
  if (first.empty() || first == "running") return -1;
  return std::stol(first);
}

// A client asks (FETCH) and blocks reading the answer; the worker reads the
// request a while later. On a unix socket the kernel wakes a thread blocked
// in recv whenever its peer reads what it sent (room to write again), and
// the recv sleeps again: one wake-up for nothing per round trip. The reply's
// wait sleeps in poll, which only bytes (or an end) end.
TEST(FrameSocketTest, AReplysWaitSleepsOnceWhileThePeerReadsTheRequest) {
  Pair pair = UnixPair();
  FrameSocket& client = *pair.writer;
  FrameSocket& worker = *pair.reader;
  ASSERT_TRUE(client.SendControl(FrameType::kFetch, ShardKey{3, 0}).ok());

  std::atomic<pid_t> tid{0};
  int64_t sleeps = -1;
  absl::Status read;
  std::thread waiting([&] {
    const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
    const int64_t before = TaskStatus(self, "voluntary_ctxt_switches");
    tid.store(self);
    bool eof = false;
    read = client.ReadHeader(&eof).status();
    sleeps = TaskStatus(self, "voluntary_ctxt_switches") - before;
  });
  // Until the client sleeps in its read (poll, or recvmsg before the fix).
  const absl::Time limit = absl::Now() + absl::Seconds(30);
  while (tid.load() == 0 || (TaskSyscall(tid.load()) != SYS_poll &&
                             TaskSyscall(tid.load()) != SYS_recvmsg)) {
    ASSERT_LT(absl::Now(), limit) << "the client never blocked in its read";
    std::this_thread::yield();
  }
  const int64_t asleep = TaskStatus(tid.load(), "voluntary_ctxt_switches");

  bool eof = false;
  absl::StatusOr<FrameHeader> fetch = worker.ReadHeader(&eof);
  ASSERT_TRUE(fetch.ok()) << fetch.status();
  // Room to write: a recv would wake now and sleep again. What is asserted
  // is that no such wake-up comes, so it is watched for over a bounded
  // window (ending early when it comes: the old read; poll's wait, which
  // does not wake, takes all 200 ms). The sleep is that window's tick.
  const absl::Time window = absl::Now() + absl::Milliseconds(200);
  while (TaskStatus(tid.load(), "voluntary_ctxt_switches") == asleep &&
         absl::Now() < window) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(worker.SendControl(FrameType::kAck, ShardKey{3, 0}).ok());
  waiting.join();
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(sleeps, 1) << "the client's read woke for nothing";
}

}  // namespace
}  // namespace plexus::transport::internal
