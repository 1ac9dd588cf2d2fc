// FramePoller over socket pairs: each connection's frames in order, a
// frame split across writes handed out once whole, a peer stopped
// mid-frame holding no one else's frames, each end said once (EOF, a
// malformed frame, a frame of another generation, a callback's error),
// and nothing after Remove; an OPS poller takes OPS frames only.
#include "plexus/transport/frame_poller.h"

#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plexus/transport/internal/frame_socket.h"

namespace plexus::transport {
namespace {

using internal::FrameHeader;
using internal::FrameSocket;
using internal::FrameType;

constexpr absl::Duration kDeadline = absl::Seconds(30);

class FramePollerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto poller = FramePoller::Start(PolledFrames::kReports, "test-reports",
                                     "the worker");
    ASSERT_TRUE(poller.ok()) << poller.status();
    poller_ = std::move(*poller);
  }
  void TearDown() override {
    poller_.reset();
    for (int fd : workers_) ::close(fd);
  }

  // A connection for worker `id`: the poller (`poller`, default the
  // REPORTS one) reads one end, the test writes the returned other. A
  // frame "fail" is refused by the callback.
  int Add(int64_t id, uint64_t generation = 0, FramePoller* poller = nullptr) {
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    workers_.push_back(pair[1]);
    if (poller == nullptr) poller = poller_.get();
    absl::Status added = poller->Add(
        id, pair[0],
        [this, id](std::string& message) {
          absl::MutexLock lock(&mu_);
          got_[id].push_back(message);
          if (message == "fail") return absl::InternalError("told to fail");
          return absl::OkStatus();
        },
        [this, id](const absl::Status& why) {
          absl::MutexLock lock(&mu_);
          ended_[id].push_back(why);
        },
        generation);
    EXPECT_TRUE(added.ok()) << added;
    return pair[1];
  }

  static std::string Frame(absl::string_view message,
                           FrameType type = FrameType::kReports,
                           uint64_t generation = 0) {
    FrameHeader header;
    header.type = static_cast<uint16_t>(type);
    header.generation = generation;
    header.payload_bytes = message.size();
    std::string bytes(reinterpret_cast<const char*>(&header), sizeof(header));
    bytes.append(message.data(), message.size());
    return bytes;
  }
  static void Write(int fd, absl::string_view bytes) {
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // Once worker `id` has `n` reports and `ends` ends (or at the deadline).
  void AwaitFor(int64_t id, size_t n, size_t ends) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return got_[id].size() >= n && ended_[id].size() >= ends;
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), kDeadline);
  }

  std::unique_ptr<FramePoller> poller_;
  std::vector<int> workers_;
  absl::Mutex mu_;
  std::map<int64_t, std::vector<std::string>> got_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<absl::Status>> ended_ ABSL_GUARDED_BY(mu_);
};

TEST_F(FramePollerTest, EachConnectionsFramesInOrderASplitOneOnceWhole) {
  const int a = Add(1), b = Add(2);
  // Through the worker's own writer, and by hand in pieces.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(FrameSocket::SendMessageOn(a, FrameType::kReports,
                                           absl::StrCat("a", i), 7)
                    .ok());
  }
  const std::string split = Frame(std::string(100000, 'x'));
  Write(b, split.substr(0, 10));    // not even a header
  Write(b, split.substr(10, 500));  // a header, part of the payload
  // B stopped mid-frame: A's reports still come.
  AwaitFor(1, 100, 0);
  Write(b, split.substr(510));
  Write(b, Frame("b-after"));
  AwaitFor(2, 2, 0);
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(got_[1].size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got_[1][i], absl::StrCat("a", i));
  ASSERT_EQ(got_[2].size(), 2u);
  EXPECT_EQ(got_[2][0], std::string(100000, 'x'));
  EXPECT_EQ(got_[2][1], "b-after");
  EXPECT_TRUE(ended_[1].empty());
  EXPECT_TRUE(ended_[2].empty());
}

TEST_F(FramePollerTest, EachEndIsSaidOnceAndNothingComesAfterRemove) {
  // The worker closes its end after a report: the report, then the end.
  const int closes = Add(1);
  Write(closes, Frame("last"));
  ::shutdown(closes, SHUT_WR);
  AwaitFor(1, 1, 1);
  // A frame of another type, and a report the callback refuses.
  const int wrong = Add(2);
  FrameHeader ops;
  ops.type = static_cast<uint16_t>(FrameType::kOps);
  Write(wrong, std::string(reinterpret_cast<const char*>(&ops), sizeof(ops)));
  AwaitFor(2, 0, 1);
  const int refused = Add(3);
  Write(refused, Frame("fail") + Frame("never"));
  AwaitFor(3, 1, 1);
  // Removed: what it sends later is never handed out.
  const int removed = Add(4);
  Write(removed, Frame("before"));
  AwaitFor(4, 1, 0);
  poller_->Remove(4);
  // Its socket is closed there: the write fails (EPIPE), or is never read.
  const std::string after = Frame("after");
  (void)::send(removed, after.data(), after.size(), MSG_NOSIGNAL);
  // A connection added after all of it still works (the poller goes on),
  // and its report comes after whatever 4's would have.
  const int later = Add(5);
  Write(later, Frame("five"));
  AwaitFor(5, 1, 0);
  poller_->Remove(1);  // ended already: only closed
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(got_[1], std::vector<std::string>({"last"}));
  ASSERT_EQ(ended_[1].size(), 1u);
  EXPECT_EQ(ended_[1][0].code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(got_[2].empty());
  ASSERT_EQ(ended_[2].size(), 1u);
  EXPECT_EQ(ended_[2][0].code(), absl::StatusCode::kInvalidArgument)
      << ended_[2][0];
  EXPECT_EQ(got_[3], std::vector<std::string>({"fail"}));
  ASSERT_EQ(ended_[3].size(), 1u);
  EXPECT_EQ(ended_[3][0].code(), absl::StatusCode::kInternal);
  EXPECT_EQ(got_[4], std::vector<std::string>({"before"}));
  EXPECT_TRUE(ended_[4].empty());
  EXPECT_EQ(got_[5], std::vector<std::string>({"five"}));
}

TEST_F(FramePollerTest, AConnectionsFramesKeepOneGenerationAndTheirType) {
  // The first frame's generation, then another: the end names both.
  const int first = Add(1);
  Write(first, Frame("g7", FrameType::kReports, 7) +
                   Frame("g8", FrameType::kReports, 8));
  AwaitFor(1, 1, 1);
  // The generation it was added with: a frame of another ends it at once.
  const int told = Add(2, /*generation=*/5);
  Write(told, Frame("g6", FrameType::kReports, 6));
  AwaitFor(2, 0, 1);
  // An OPS poller takes OPS frames, and ends a connection that sends
  // REPORTS.
  auto ops = FramePoller::Start(PolledFrames::kOps, "test-ops", "the server");
  ASSERT_TRUE(ops.ok()) << ops.status();
  const int server = Add(3, /*generation=*/9, ops->get());
  Write(server, Frame("op", FrameType::kOps, 9));
  AwaitFor(3, 1, 0);
  Write(server, Frame("report", FrameType::kReports, 9));
  AwaitFor(3, 1, 1);
  ::shutdown(Add(4, 0, ops->get()), SHUT_WR);
  AwaitFor(4, 0, 1);
  ops->reset();
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(got_[1], std::vector<std::string>({"g7"}));
  ASSERT_EQ(ended_[1].size(), 1u);
  EXPECT_EQ(ended_[1][0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ended_[1][0].message().find("generation 8"), std::string::npos)
      << ended_[1][0];
  EXPECT_NE(ended_[1][0].message().find("generation 7"), std::string::npos)
      << ended_[1][0];
  EXPECT_TRUE(got_[2].empty());
  ASSERT_EQ(ended_[2].size(), 1u);
  EXPECT_EQ(ended_[2][0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got_[3], std::vector<std::string>({"op"}));
  ASSERT_EQ(ended_[3].size(), 1u);
  EXPECT_NE(ended_[3][0].message().find("expected OPS"), std::string::npos)
      << ended_[3][0];
  ASSERT_EQ(ended_[4].size(), 1u);
  EXPECT_EQ(ended_[4][0].message(), "the server closed it");
}

}  // namespace
}  // namespace plexus::transport
