// Exponential back-off between attempts to reach something that went away
// (a worker rejoining its server). The first retry comes `initial` after
// the first failure, each next one `multiplier` times later than the one
// before, never more than `cap` apart, and there is none once
// `give_up_after` has passed since the first failure of the run (zero:
// never give up). A success ends the run (Reset).
//
// Plain arithmetic: the caller passes the time (read from its injected
// Clock), so tests step through a schedule without waiting. Not
// thread-safe.
#pragma once

#include <optional>

#include "absl/time/time.h"

namespace plexus {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);
  double multiplier = 2.0;
  absl::Duration cap = absl::Seconds(5);
  absl::Duration give_up_after = absl::Minutes(5);  // zero: never
};

class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {}) : options_(options) {}

  // An attempt failed at `now`: how long to wait before the next one, or
  // nullopt when the run has lasted `give_up_after` (the caller gives up).
  // A wait never reaches past the give-up time.
  std::optional<absl::Duration> NextDelay(absl::Time now);
  // An attempt succeeded: the next failure starts a new run at `initial`.
  void Reset();
  // Failures in this run so far.
  int failures() const { return failures_; }

 private:
  const BackoffOptions options_;
  int failures_ = 0;
  absl::Time first_failure_;
  absl::Duration next_ = absl::ZeroDuration();
};

}  // namespace plexus
