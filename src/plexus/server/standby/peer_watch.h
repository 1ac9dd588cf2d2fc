// The other server of a pair, watched by the one that serves for as long
// as it may have been taken over without knowing it (plexus-server
// --standby-of PEER, once it serves). A primary that was stopped
// (SIGSTOP, a frozen VM) or cut off from its standby past the lease comes
// back to find its standby serving, with the workers and clients; it must
// not serve beside it. So:
//
//   armed: its standby's stream ended, or it found itself stalled for the
//          lease ──▶ ask the other every `period`: do you serve?
//   disarmed: a standby follows it again (the other is that standby)
//   the other serves (answers a status call within `timeout`; a standby
//   refuses connections, a stopped process never answers) ──▶ on_serves()
//          once: the server steps down
//
// Only a server that had a standby, or stalled, is armed: the one that
// took over never had either, so of two serving servers the stale one
// steps down, not both.
//
// Thread-safe. One thread of its own, asleep while disarmed.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"

namespace plexus {

// Whether a Plexus server answers at `address` within `timeout` (a status
// call over SessionChannel's credentials, `tls_ca` or $PLEXUS_TLS_CA).
bool PeerServes(const std::string& address, const std::string& tls_ca,
                absl::Duration timeout);

struct PeerWatchOptions {
  std::string peer;    // the other server's address
  std::string tls_ca;  // for PeerServes
  absl::Duration period = absl::Milliseconds(250);
  absl::Duration timeout = absl::Seconds(1);
  Clock* clock = Clock::Real();
  // The question asked while armed (tests replace it).
  std::function<bool(const std::string& peer, absl::Duration timeout)> serves;
};

class PeerWatch {
 public:
  PeerWatch(PeerWatchOptions options, std::function<void()> on_serves);
  ~PeerWatch();  // stops and joins its thread; on_serves never runs after
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Starts asking (`why`, logged once per arming).
  void Arm(const std::string& why);
  void Disarm();
  bool armed() const;

 private:
  void Loop();

  const PeerWatchOptions options_;
  const std::function<void()> on_serves_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  // Times Arm() armed it: one that comes while the other is being asked
  // (its signal before the loop waits) is not lost.
  uint64_t arms_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace plexus
