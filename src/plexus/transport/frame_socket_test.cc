// FrameSocket's reads: read-ahead (frames sent together cost one recv, and
// each frame's bytes are still its own), its refusal of descriptors, and
// the frame timeout on a connection that reads ahead.
#include "plexus/transport/internal/frame_socket.h"

#include <sys/socket.h>

#include <memory>
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

}  // namespace
}  // namespace plexus::transport::internal
