#include "plexus/timeline/clock_offset.h"

#include <algorithm>

namespace plexus {

void ClockOffsetEstimator::Add(const ClockSample& sample) {
  if (sample.t4 < sample.t1 || sample.t3 < sample.t2 || sample.delay() < 0) {
    return;
  }
  samples_.push_back(sample);
  while (samples_.size() > window_) samples_.pop_front();
}

const ClockSample* ClockOffsetEstimator::Best() const {
  const ClockSample* best = nullptr;
  for (const ClockSample& s : samples_) {
    if (best == nullptr || s.delay() < best->delay()) best = &s;
  }
  return best;
}

int64_t ClockOffsetEstimator::offset_ns() const {
  const ClockSample* best = Best();
  return best == nullptr ? 0 : best->offset();
}

int64_t ClockOffsetEstimator::error_ns() const {
  const ClockSample* best = Best();
  return best == nullptr ? -1 : best->delay() / 2;
}

int64_t SinceOnOtherClock(int64_t since_ns, int64_t offset_ns,
                          int64_t error_ns) {
  if (since_ns == 0) return 0;
  const int64_t other = since_ns - offset_ns - std::max<int64_t>(error_ns, 0);
  return std::max<int64_t>(other, 1);  // 0 would ask for everything
}

}  // namespace plexus
