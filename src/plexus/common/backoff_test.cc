#include "plexus/common/backoff.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(BackoffTest, DoublesUpToTheCap) {
  Backoff backoff({.initial = absl::Milliseconds(100),
                   .multiplier = 2,
                   .cap = absl::Milliseconds(500),
                   .give_up_after = absl::ZeroDuration()});
  absl::Time now = absl::UnixEpoch();
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 6; ++i) {
    auto d = backoff.NextDelay(now);
    ASSERT_TRUE(d.has_value());
    delays.push_back(*d);
    now += *d;
  }
  EXPECT_EQ(delays, (std::vector<absl::Duration>{
                        absl::Milliseconds(100), absl::Milliseconds(200),
                        absl::Milliseconds(400), absl::Milliseconds(500),
                        absl::Milliseconds(500), absl::Milliseconds(500)}));
  EXPECT_EQ(backoff.failures(), 6);
}

TEST(BackoffTest, GivesUpAfterTheLimitAndNeverWaitsPastIt) {
  Backoff backoff({.initial = absl::Seconds(1),
                   .multiplier = 2,
                   .cap = absl::Seconds(4),
                   .give_up_after = absl::Seconds(5)});
  absl::Time now = absl::UnixEpoch();
  EXPECT_EQ(backoff.NextDelay(now), absl::Seconds(1));
  now += absl::Seconds(1);
  EXPECT_EQ(backoff.NextDelay(now), absl::Seconds(2));
  now += absl::Seconds(2);
  // 4 s would end 2 s after the limit: the last wait stops at it.
  EXPECT_EQ(backoff.NextDelay(now), absl::Seconds(2));
  now += absl::Seconds(2);
  EXPECT_EQ(backoff.NextDelay(now), std::nullopt);
}

TEST(BackoffTest, ASuccessStartsANewRun) {
  Backoff backoff({.initial = absl::Milliseconds(10),
                   .multiplier = 3,
                   .cap = absl::Seconds(1),
                   .give_up_after = absl::Seconds(1)});
  absl::Time now = absl::UnixEpoch();
  EXPECT_EQ(backoff.NextDelay(now), absl::Milliseconds(10));
  EXPECT_EQ(backoff.NextDelay(now), absl::Milliseconds(30));
  backoff.Reset();
  // Much later: a new run, with its own give-up time.
  now += absl::Hours(1);
  EXPECT_EQ(backoff.NextDelay(now), absl::Milliseconds(10));
  EXPECT_EQ(backoff.failures(), 1);
}

}  // namespace
}  // namespace plexus
