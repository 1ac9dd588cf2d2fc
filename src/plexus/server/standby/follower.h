// The standby's side of a primary server's journal (plexus-server
// --standby-of PRIMARY): it follows the primary's Follow stream into a
// journal of its own, synced record by record, and returns when it should
// take over: the primary has been silent for its lease (FollowUpdate's
// lease_ms). The caller then opens that journal as a restarted server does
// (ServerImpl::OpenJournal): workers and client sessions resume with it,
// finding it at the next address of their server list (ServerTarget).
//
//   connect ──▶ snapshot (the journal becomes it) ──▶ records ⟲ synced
//      ▲                                                 │ stream ends or
//      └── the primary answers within its lease ◀────────┘ goes silent
//                                                  lease over: take over
//
// It takes over only after it has followed once (it never serves an empty
// journal because its primary was not up yet), and not when the primary
// said it shut down on purpose; the first of a pair serves its own journal
// when no primary answers at its start (serve_alone_after). While the primary
// is away it keeps trying to reach it (every 100 ms); one that answers within
// the lease is followed again, from a new snapshot. A primary that is only
// stopped (SIGSTOP) past the lease is taken over too: docs/RELIABILITY.md says
// what that costs.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"

namespace plexus {

struct FollowerOptions {
  std::string primary;       // the primary's address
  std::string journal_path;  // this standby's journal (created if absent)
  ClusterSecret secret;      // the cluster's (the admin credential)
  std::string tls_ca;        // SessionChannel's
  std::string name;          // for the primary's logs
  // Until the primary says its lease: how long silence lasts before a
  // takeover.
  absl::Duration lease = absl::Seconds(3);
  Clock* clock = Clock::Real();
  // The first of a pair (plexus-server --serve-if-alone-ms): if no
  // primary could be followed this long after the start, serve this
  // journal (FollowEnd::kServeAlone). Its peer has no such limit, so of
  // two started together this one serves and the other follows it; one
  // restarted while its peer serves, or takes over within this time,
  // follows the peer. Infinite: wait for a primary for ever.
  absl::Duration serve_alone_after = absl::InfiniteDuration();
  // Called once, when it first follows the primary (its journal is the
  // primary's from then on). May be empty.
  std::function<void()> on_first_follow;
};

// What FollowUntilTakeover ended with.
enum class FollowEnd {
  kTakeOver,         // the primary was silent for its lease: serve its journal
  kServeAlone,       // no primary within serve_alone_after: serve this journal
  kPrimaryShutDown,  // the primary shut down on purpose: stop too
  kStopped,          // `stop` was set
};

// Follows until one of FollowEnd; an error if this standby's journal
// cannot be opened or written (it must not take over from a journal that
// lacks what the primary was told it had). `stop` (may be null) is read
// between attempts and while waiting.
absl::StatusOr<FollowEnd> FollowUntilTakeover(const FollowerOptions& options,
                                              const std::atomic<bool>* stop);

}  // namespace plexus
