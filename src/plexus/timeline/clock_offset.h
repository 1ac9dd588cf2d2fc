// How far another process's timeline clock is from this one's, estimated
// from round trips as NTP does: the other side stamps a message as it
// sends it (t1, its clock), this side as it reads it (t2) and as it
// answers (t3), the other side as it reads the answer (t4). Then
//
//   offset = ((t2 - t1) + (t3 - t4)) / 2   (add to the other's times)
//   delay  = (t4 - t1) - (t3 - t2)         (the round trip's time in flight)
//
// and the offset is exact when both directions took equal time; its error
// is at most delay / 2. Queues (a busy reader, a full stream) lengthen one
// direction, so of the last `window` samples the one with the least delay
// gives the estimate (the minimum-delay filter).
//
// The server keeps one per worker and feeds it from heartbeats: each
// heartbeat carries t1, the server answers with a ClockEcho (t1, t2, t3),
// and the worker's next heartbeat carries the completed sample.
//
// Pure; not thread-safe by itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace plexus {

struct ClockSample {
  int64_t t1 = 0;  // other's clock: sent
  int64_t t2 = 0;  // this clock: received
  int64_t t3 = 0;  // this clock: answered
  int64_t t4 = 0;  // other's clock: answer received
  int64_t offset() const { return ((t2 - t1) + (t3 - t4)) / 2; }
  int64_t delay() const { return (t4 - t1) - (t3 - t2); }
};

class ClockOffsetEstimator {
 public:
  explicit ClockOffsetEstimator(size_t window = 64) : window_(window) {}
  // Ignores samples whose stamps are out of order (t4 < t1, t3 < t2).
  void Add(const ClockSample& sample);
  bool has_estimate() const { return !samples_.empty(); }
  // Add to the other process's times to have this one's. 0 without
  // samples.
  int64_t offset_ns() const;
  // The estimate's bound: half the least delay (-1 without samples).
  int64_t error_ns() const;
  size_t samples() const { return samples_.size(); }

 private:
  const ClockSample* Best() const;
  size_t window_;
  std::deque<ClockSample> samples_;
};

// The time on the other process's clock from which its events may be at or
// after `since_ns` on this one, given an estimate (offset_ns, error_ns) as
// above: the estimate's error widens the window, never cuts it, so a trace
// asked of a worker whose first probe was slow (a loaded machine) still
// holds its first events. 0 (everything) stays 0; without an estimate
// (error -1) the clocks are taken as equal.
int64_t SinceOnOtherClock(int64_t since_ns, int64_t offset_ns,
                          int64_t error_ns);

}  // namespace plexus
