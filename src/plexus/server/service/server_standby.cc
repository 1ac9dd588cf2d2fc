// ServerImpl: the standby's stream (Follow) and the wait for its sync
// before a change leaves the server (AwaitStandbyLocked). The standby's
// side is standby/follower.h; the records' queue standby/journal_feed.h.
#include <thread>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/server/service/internal/server_impl.h"

namespace plexus {
namespace {

// Records queued for a standby that reads none before it is cut off.
constexpr size_t kMaxQueuedForStandby = 1 << 16;

}  // namespace

grpc::Status ServerImpl::Follow(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<proto::FollowUpdate, proto::FollowRequest>*
        stream) {
  proto::FollowRequest hello;
  if (!stream->Read(&hello)) return grpc::Status::CANCELLED;
  const std::string& credential = hello.credential();
  if (!secret_.Verify(CredentialRole::kAdmin, 0,
                      reinterpret_cast<const uint8_t*>(credential.data()),
                      credential.size())) {
    SPDLOG_WARN("refused a standby from {}: {} admin credential", ctx->peer(),
                credential.empty() ? "no" : "a wrong");
    return grpc::Status(grpc::PERMISSION_DENIED,
                        "a standby needs the cluster's admin credential");
  }
  const std::string name =
      hello.standby().empty() ? ctx->peer() : hello.standby().substr(0, 200);
  std::shared_ptr<JournalFeed> feed;
  proto::FollowUpdate update;
  {
    absl::MutexLock lock(&mu_);
    if (journal_ == nullptr) {
      return grpc::Status(grpc::FAILED_PRECONDITION,
                          "this server keeps no journal (--journal): a "
                          "standby has nothing to follow");
    }
    if (shutdown_) return grpc::Status(grpc::UNAVAILABLE, "shutting down");
    if (standby_feed_ != nullptr) {
      return grpc::Status(
          grpc::FAILED_PRECONDITION,
          absl::StrCat("a standby already follows this server: ",
                       standby_name_));
    }
    // From here every record appended under mu_ goes to the feed too: the
    // snapshot is the model after the last record before them.
    const uint64_t base = static_cast<uint64_t>(journal_sink_->records());
    feed = std::make_shared<JournalFeed>(base, kMaxQueuedForStandby,
                                         options_.clock);
    standby_feed_ = feed;
    standby_name_ = name;
    // The other server follows: it did not take over.
    if (peer_watch_ != nullptr) peer_watch_->Disarm();
    journal_sink_->set_tee(
        [feed](std::string record) { feed->Push(std::move(record)); });
    update.set_snapshot(state_.SnapshotRecords().SerializeAsString());
    update.set_last(base);
  }
  const absl::Duration lease = options_.standby_lease;
  update.set_lease_ms(absl::ToInt64Milliseconds(lease));
  SPDLOG_INFO(
      "standby {} follows the journal from record {} (it takes over after "
      "{} of silence)",
      name, update.last(), absl::FormatDuration(lease));
  // What the standby has synced, read on a thread of its own.
  std::thread reader([stream, feed] {
    proto::FollowRequest ack;
    while (stream->Read(&ack)) feed->Synced(ack.synced());
    feed->Close(absl::UnavailableError("the standby's stream ended"));
  });
  bool ok = stream->Write(update);
  while (ok) {
    proto::FollowUpdate next;
    uint64_t last = 0;
    std::vector<std::string> records;
    if (!feed->Take(&records, &last, options_.clock->Now() + lease / 4)) break;
    for (std::string& r : records) next.add_records(std::move(r));
    next.set_last(last);
    ok = stream->Write(next);
  }
  bool requested = false;
  {
    absl::MutexLock lock(&mu_);
    requested = shutdown_requested_;
  }
  if (ok && requested) {
    // An operator's shutdown: the standby stops too.
    proto::FollowUpdate last;
    last.set_shutdown(true);
    stream->Write(last);
  }
  ctx->TryCancel();
  reader.join();
  absl::MutexLock lock(&mu_);
  const absl::Status why = feed->closed();
  if (standby_feed_ == feed) DetachStandbyLocked(why);
  SPDLOG_WARN("standby {} no longer follows: {}", name, why.ToString());
  // It may have taken over (this server was stalled past the lease, or
  // cut off from it), or just gone: the peer watch asks.
  if (peer_watch_ != nullptr && !shutdown_ && standby_feed_ == nullptr) {
    peer_watch_->Arm(absl::StrCat("standby ", name, " no longer follows"));
  }
  return grpc::Status::OK;
}

void ServerImpl::AwaitStandbyLocked() {
  if (standby_feed_ == nullptr) return;
  const uint64_t appended = static_cast<uint64_t>(journal_sink_->records());
  absl::Status s = standby_feed_->AwaitSynced(
      appended, options_.clock->Now() + options_.standby_sync_timeout);
  if (s.ok()) return;
  SPDLOG_ERROR(
      "standby {} did not sync the journal's changes ({}): it is cut off, "
      "and a takeover now would lose them; it follows again from a "
      "snapshot when it reconnects",
      standby_name_, s.ToString());
  DetachStandbyLocked(s);
}

void ServerImpl::DetachStandbyLocked(const absl::Status& why) {
  if (standby_feed_ == nullptr) return;
  standby_feed_->Close(why);
  journal_sink_->set_tee(nullptr);
  standby_feed_.reset();
  standby_name_.clear();
}

}  // namespace plexus
