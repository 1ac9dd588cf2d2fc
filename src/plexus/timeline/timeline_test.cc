#include "plexus/timeline/timeline.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "plexus/timeline/timeline_proto.h"

namespace plexus {
namespace {

TimelineEvent At(int64_t start, int64_t end, uint64_t call) {
  TimelineEvent e;
  e.kind = EventKind::kTask;
  e.start_ns = start;
  e.end_ns = end;
  e.call_id = call;
  return e;
}

TEST(TimelineTest, KeepsTheLastCapacityEventsOldestFirst) {
  Timeline t({.capacity = 4});
  for (int i = 1; i <= 10; ++i) t.Record(At(i * 10, i * 10 + 5, i));
  EXPECT_EQ(t.capacity(), 4u);
  EXPECT_EQ(t.recorded(), 10u);
  EXPECT_EQ(t.dropped(), 6u);
  std::vector<TimelineEvent> kept = t.Since(0);
  ASSERT_EQ(kept.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(kept[i].call_id, 7u + i);
  // Those that end at or after the time asked for.
  kept = t.Since(96);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].call_id, 10u);
}

TEST(TimelineTest, BoundedWhateverTheJobsLength) {
  Timeline t({.capacity = 1000});
  const size_t capacity = t.capacity();
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&t, k] {
      for (int i = 0; i < 100000; ++i) t.Record(At(i, i + 1, k));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.recorded(), 400000u);
  EXPECT_EQ(t.Since(0).size(), capacity);
  EXPECT_EQ(t.capacity(), capacity);  // the ring never grew
}

TEST(TimelineTest, RecordsNothingWhenOff) {
  Timeline t({.enabled = false});
  t.Record(At(1, 2, 3));
  { ScopedEvent e(&t, EventKind::kCompile); }
  EXPECT_EQ(t.recorded(), 0u);
  t.set_enabled(true);
  { ScopedEvent e(&t, EventKind::kCompile); }
  EXPECT_EQ(t.recorded(), 1u);
}

TEST(TimelineTest, ScopedEventSpansItsScopeOnTheSkewedClock) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  Timeline t({.clock = &clock, .skew = absl::Milliseconds(250)});
  {
    ScopedEvent e(&t, EventKind::kCompile);
    e.event.label = t.Intern("mlp");
    clock.Advance(absl::Milliseconds(3));
  }
  std::vector<TimelineEvent> kept = t.Since(0);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].start_ns, 1000'250'000'000);
  EXPECT_EQ(kept[0].end_ns - kept[0].start_ns, 3'000'000);
  EXPECT_EQ(t.Label(kept[0].label), "mlp");
  EXPECT_EQ(t.Intern("mlp"), kept[0].label);
}

TEST(TimelineTest, LabelsAreBounded) {
  Timeline t;
  for (size_t i = 1; i < Timeline::kMaxLabels; ++i) {
    EXPECT_NE(t.Intern(std::to_string(i)), 0u);
  }
  EXPECT_EQ(t.Intern("one too many"), 0u);
  EXPECT_EQ(t.Label(0), "");
}

TEST(TimelineTest, ChunksCarryEveryEventAndTheLabelsOnce) {
  Timeline t({.capacity = 100});
  for (int i = 0; i < 25; ++i) {
    TimelineEvent e = At(i, i + 1, i);
    e.label = t.Intern(i % 2 == 0 ? "even" : "odd");
    t.Record(e);
  }
  std::vector<proto::TimelineRing> chunks = RingChunks(t, 0, 10);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].events_size() + chunks[1].events_size() +
                chunks[2].events_size(),
            25);
  EXPECT_EQ(chunks[0].labels_size(), 3);  // "", "even", "odd"
  EXPECT_EQ(chunks[0].recorded(), 25u);
  EXPECT_EQ(chunks[1].labels_size(), 0);
}

}  // namespace
}  // namespace plexus
