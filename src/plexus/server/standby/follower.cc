#include "plexus/server/standby/follower.h"

#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "plexus/common/logging.h"
#include "plexus/common/tls.h"
#include "plexus/journal/journal.h"
#include "plexus/proto/plexus.grpc.pb.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/model/model_journal.h"

namespace plexus {
namespace {

constexpr absl::Duration kRetry = absl::Milliseconds(100);
constexpr absl::Duration kSyncTimeout = absl::Seconds(30);
// The standby's journal is compacted into one snapshot (of its replica of
// the model) once this many records came after the last one.
constexpr int64_t kCompactEvery = 10000;

// This standby's journal and its replica of the primary's model (for
// compaction: the snapshot a compaction writes).
class FollowedJournal {
 public:
  explicit FollowedJournal(std::unique_ptr<journal::Journal> journal)
      : journal_(std::move(journal)) {}

  // The primary's snapshot replaces everything before it: a no-op record
  // (a compaction replaces records, and there may be none since the last
  // snapshot), then the snapshot in its place.
  absl::Status Reset(const std::string& snapshot) {
    proto::ModelSnapshot parsed;
    if (!parsed.ParseFromString(snapshot)) {
      return absl::DataLossError("the primary's snapshot does not parse");
    }
    replica_ = std::make_unique<ClusterState>();
    for (const proto::ModelRecord& r : parsed.records()) {
      if (absl::Status s = replica_->Restore(r); !s.ok()) return s;
    }
    proto::ModelRecord marker;
    marker.set_server_ids(0);
    absl::StatusOr<uint64_t> seq =
        journal_->Append(kModelRecordType, marker.SerializeAsString());
    if (!seq.ok()) return seq.status();
    since_compaction_ = 0;
    return journal_->Compact(*seq, snapshot);
  }

  absl::Status Append(const std::string& record) {
    proto::ModelRecord parsed;
    if (!parsed.ParseFromString(record)) {
      return absl::DataLossError(
          "a journal record of the primary's does not "
          "parse");
    }
    if (absl::Status s = replica_->Restore(parsed); !s.ok()) return s;
    absl::StatusOr<uint64_t> seq = journal_->Append(kModelRecordType, record);
    if (!seq.ok()) return seq.status();
    ++since_compaction_;
    return absl::OkStatus();
  }

  absl::Status Sync(absl::Time deadline) {
    absl::Status s = journal_->AwaitDurable(journal_->last_seq(), deadline);
    if (!s.ok() || since_compaction_ < kCompactEvery) return s;
    since_compaction_ = 0;
    return journal_->Compact(journal_->last_seq(),
                             replica_->SnapshotRecords().SerializeAsString());
  }

 private:
  std::unique_ptr<journal::Journal> journal_;
  std::unique_ptr<ClusterState> replica_;
  int64_t since_compaction_ = 0;
};

// Cancels a session's stream once the primary has been silent for the
// lease (a primary that is stopped, or a network that drops everything,
// ends no stream), or `stop` is set.
class Watchdog {
 public:
  // `heard`: when the primary was last heard from (a session after a
  // broken one is cut at the same lease's end, not a lease later).
  Watchdog(Clock* clock, grpc::ClientContext* ctx, absl::Time heard,
           absl::Duration lease, const std::atomic<bool>* stop)
      : clock_(clock), ctx_(ctx), lease_(lease), stop_(stop) {
    heard_ = heard;
    thread_ = std::thread([this] { Loop(); });
  }
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      cv_.SignalAll();
    }
    thread_.join();
  }
  void Heard(absl::Duration lease) {
    absl::MutexLock lock(&mu_);
    heard_ = clock_->Now();
    lease_ = lease;
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!done_) {
      const absl::Time until = heard_ + lease_;
      if (clock_->Now() >= until || (stop_ != nullptr && stop_->load())) {
        ctx_->TryCancel();
        return;
      }
      clock_->AwaitWithDeadline(&mu_, &cv_,
                                std::min(until, clock_->Now() + kRetry));
    }
  }

  Clock* const clock_;
  grpc::ClientContext* const ctx_;
  const std::atomic<bool>* const stop_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Time heard_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<FollowEnd> FollowUntilTakeover(const FollowerOptions& options,
                                              const std::atomic<bool>* stop) {
  Clock& clock = *options.clock;
  journal::Replay replay;
  absl::StatusOr<std::unique_ptr<journal::Journal>> opened =
      journal::Journal::Open(
          {.path = options.journal_path, .clock = options.clock}, &replay);
  if (!opened.ok()) return opened.status();
  FollowedJournal journal(*std::move(opened));
  const Credential admin = options.secret.Derive(CredentialRole::kAdmin);
  absl::Duration lease = options.lease;
  bool followed = false;  // once: never take over an empty journal
  const absl::Time started = clock.Now();
  absl::Time last_heard = started;
  bool said_away = false, said_waiting = false;
  while (true) {
    if (stop != nullptr && stop->load()) return FollowEnd::kStopped;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        SessionChannel(options.primary, options.tls_ca);
    if (!channel.ok()) return channel.status();
    std::unique_ptr<proto::Controller::Stub> stub =
        proto::Controller::NewStub(*channel);
    grpc::ClientContext ctx;
    absl::Status failed;
    bool primary_shut_down = false;
    std::unique_ptr<
        grpc::ClientReaderWriter<proto::FollowRequest, proto::FollowUpdate>>
        stream;
    {
      // Before the call starts: starting it waits for the connection, and
      // a stopped primary's kernel accepts one whose handshake never comes
      // (gRPC would wait 20 s for it).
      Watchdog watchdog(&clock, &ctx, followed ? last_heard : clock.Now(),
                        lease, stop);
      stream = stub->Follow(&ctx);
      proto::FollowRequest hello;
      hello.set_credential(admin.data(), admin.size());
      hello.set_standby(options.name);
      proto::FollowUpdate update;
      if (stream->Write(hello) && stream->Read(&update)) {
        if (update.lease_ms() > 0)
          lease = absl::Milliseconds(update.lease_ms());
        watchdog.Heard(lease);
        failed = journal.Reset(update.snapshot());
        if (failed.ok()) {
          if (!followed && options.on_first_follow) options.on_first_follow();
          followed = true;
          last_heard = clock.Now();
          said_away = said_waiting = false;
          SPDLOG_INFO(
              "standby: following the primary at {} from its record {} "
              "(takes over after {} of silence)",
              options.primary, update.last(), absl::FormatDuration(lease));
          proto::FollowRequest ack;
          ack.set_synced(update.last());
          bool ok = stream->Write(ack);
          while (ok && stream->Read(&update)) {
            last_heard = clock.Now();
            watchdog.Heard(lease);
            if (update.shutdown()) {
              primary_shut_down = true;
              break;
            }
            if (update.records_size() == 0) continue;  // a keepalive
            const absl::Time deadline = clock.Now() + kSyncTimeout;
            for (const std::string& r : update.records()) {
              if (failed = journal.Append(r); !failed.ok()) break;
            }
            if (failed.ok()) failed = journal.Sync(deadline);
            if (!failed.ok()) break;
            ack.set_synced(update.last());
            ok = stream->Write(ack);
          }
        }
      }
      ctx.TryCancel();
    }
    stream->Finish().IgnoreError();
    if (!failed.ok()) {
      return absl::Status(
          failed.code(),
          absl::StrCat("standby: its journal ", options.journal_path,
                       " cannot follow the primary's: ", failed.message()));
    }
    if (primary_shut_down) {
      SPDLOG_INFO("standby: the primary at {} shut down; so does the standby",
                  options.primary);
      return FollowEnd::kPrimaryShutDown;
    }
    if (followed) {
      const absl::Duration silent = clock.Now() - last_heard;
      if (silent >= lease) {
        SPDLOG_WARN(
            "standby: the primary at {} has been silent for {} (its lease "
            "is {}): taking over",
            options.primary, absl::FormatDuration(silent),
            absl::FormatDuration(lease));
        return FollowEnd::kTakeOver;
      }
      if (!said_away) {
        said_away = true;
        SPDLOG_WARN(
            "standby: lost the primary at {}; it takes over in {} unless "
            "the primary answers",
            options.primary, absl::FormatDuration(lease - silent));
      }
    } else if (clock.Now() - started >= options.serve_alone_after) {
      SPDLOG_WARN(
          "standby: no primary answered at {} within {} of the start: "
          "serving this server's journal ({}), as the first of the pair",
          options.primary, absl::FormatDuration(options.serve_alone_after),
          options.journal_path);
      return FollowEnd::kServeAlone;
    } else if (!said_waiting) {
      said_waiting = true;
      SPDLOG_INFO(
          "standby: waiting for the primary at {} (it takes over only after "
          "it has followed it{})",
          options.primary,
          options.serve_alone_after == absl::InfiniteDuration()
              ? ""
              : absl::StrCat("; it serves its own journal if none answers "
                             "within ",
                             absl::FormatDuration(options.serve_alone_after),
                             " of the start"));
    }
    clock.SleepFor(kRetry);
  }
}

}  // namespace plexus
