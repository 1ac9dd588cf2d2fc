#include "plexus/timeline/clock_offset.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

// A round trip between a worker whose clock reads `skew` more than the
// server's, with `out` and `back` in flight each way (ns).
ClockSample RoundTrip(int64_t at, int64_t skew, int64_t out, int64_t back) {
  ClockSample s;
  s.t1 = at + skew;
  s.t2 = at + out;
  s.t3 = s.t2 + 1000;  // the server answers 1 us later
  s.t4 = s.t3 + back + skew;
  return s;
}

TEST(ClockOffsetTest, ExactWhenBothWaysTakeEqualTime) {
  ClockOffsetEstimator est;
  EXPECT_FALSE(est.has_estimate());
  EXPECT_EQ(est.error_ns(), -1);
  est.Add(RoundTrip(1'000'000, 350'000'000, 40'000, 40'000));
  EXPECT_EQ(est.offset_ns(), -350'000'000);
  EXPECT_EQ(est.error_ns(), 40'000);
}

TEST(ClockOffsetTest, TheLeastDelayedSampleWins) {
  ClockOffsetEstimator est;
  // Queued one way for 20 ms: off by 10 ms alone.
  est.Add(RoundTrip(0, -5'000'000, 20'000'000, 50'000));
  est.Add(RoundTrip(100'000'000, -5'000'000, 60'000, 50'000));
  est.Add(RoundTrip(200'000'000, -5'000'000, 50'000, 9'000'000));
  EXPECT_NEAR(static_cast<double>(est.offset_ns()), 5'000'000, 10'000);
  EXPECT_LE(est.error_ns(), 60'000);
}

TEST(ClockOffsetTest, OldSamplesLeaveTheWindow) {
  ClockOffsetEstimator est(/*window=*/2);
  est.Add(RoundTrip(0, 0, 10, 10));  // the best, but old
  est.Add(RoundTrip(1000, 7'000, 500, 500));
  est.Add(RoundTrip(2000, 7'000, 600, 600));
  EXPECT_EQ(est.samples(), 2u);
  EXPECT_EQ(est.offset_ns(), -7'000);
}

TEST(ClockOffsetTest, IgnoresStampsOutOfOrder) {
  ClockOffsetEstimator est;
  est.Add({.t1 = 100, .t2 = 50, .t3 = 40, .t4 = 200});
  est.Add({.t1 = 100, .t2 = 50, .t3 = 60, .t4 = 90});
  EXPECT_FALSE(est.has_estimate());
}

// A worker on the same machine (its clock is the server's) whose only
// probe so far was queued 100 ms one way: the estimate is 50 ms off. The
// window asked of it must still begin at or before the asked time on its
// clock, or a short trace's events fall outside it.
TEST(ClockOffsetTest, TheWindowOnTheOtherClockCoversTheEstimatesError) {
  ClockOffsetEstimator est;
  est.Add(RoundTrip(1'000'000'000, 0, 50'000, 100'000'000));
  ASSERT_NEAR(static_cast<double>(est.offset_ns()), -50'000'000, 100'000);
  const int64_t since = 2'000'000'000;
  const int64_t since_on_worker = since;  // the clocks are equal
  const int64_t asked =
      SinceOnOtherClock(since, est.offset_ns(), est.error_ns());
  EXPECT_LE(asked, since_on_worker);
  // ... and no earlier than the error bound makes necessary.
  EXPECT_GE(asked, since_on_worker - 2 * est.error_ns());
  // The offset alone (what the server asked before) cuts 50 ms off.
  EXPECT_GT(since - est.offset_ns(), since_on_worker + 49'000'000);
}

TEST(ClockOffsetTest, SinceOnOtherClockKeepsEverythingAndNoEstimate) {
  EXPECT_EQ(SinceOnOtherClock(0, 5'000, 1'000), 0);     // everything stays so
  EXPECT_EQ(SinceOnOtherClock(10'000, 0, -1), 10'000);  // no estimate
  EXPECT_EQ(SinceOnOtherClock(10'000, 2'000, 500), 7'500);
  EXPECT_EQ(SinceOnOtherClock(1'000, 5'000, 0), 1);  // never "everything"
}

}  // namespace
}  // namespace plexus
