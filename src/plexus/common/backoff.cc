#include "plexus/common/backoff.h"

#include <algorithm>

namespace plexus {

std::optional<absl::Duration> Backoff::NextDelay(absl::Time now) {
  if (failures_++ == 0) {
    first_failure_ = now;
    next_ = options_.initial;
  }
  absl::Duration delay = std::min(next_, options_.cap);
  next_ = std::min(next_ * options_.multiplier, options_.cap);
  if (options_.give_up_after > absl::ZeroDuration()) {
    const absl::Time give_up = first_failure_ + options_.give_up_after;
    if (now >= give_up) return std::nullopt;
    delay = std::min(delay, give_up - now);
  }
  return delay;
}

void Backoff::Reset() {
  failures_ = 0;
  next_ = absl::ZeroDuration();
}

}  // namespace plexus
