// A reconnect's restore (ClientSession::Restore): in the new session, every
// live slice is asked for again with the options it was made with, and
// every live program registered again on its slice's new map; what cannot
// be is marked lost, saying why. Then the session opens for use.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/client/client_session.h"
#include "plexus/common/backoff.h"
#include "plexus/common/logging.h"

namespace plexus {

void ClientSession::Restore(const std::shared_ptr<SessionTag>& tag) {
  const uint64_t epoch = tag->epoch;
  std::vector<std::shared_ptr<Slice>> slices;
  std::vector<std::shared_ptr<Program>> programs;
  LiveTracked(&slices, &programs);
  Restored counts;
  // Each slice as it was asked for, one after another (a slice may avoid
  // the hosts of one asked for before it); the map before, for programs.
  absl::flat_hash_map<const Slice*, proto::SliceInfo> before;
  for (const auto& slice : slices) {
    if (slice->closed() || !slice->lost().ok()) continue;
    proto::SliceInfo map_before = slice->info();
    if (!RestoreSlice(*slice, epoch, counts)) return;  // the next one tries
    if (slice->epoch() == epoch) before[slice.get()] = std::move(map_before);
  }
  // Programs, on their slices' new maps. Queued before any call: every
  // caller waits until the session is open, below.
  std::vector<proto::ClientOp> ops;
  for (const auto& program : programs) {
    if (!program->lost().ok()) continue;
    if (auto op = RestoreProgram(*program, epoch, before, counts)) {
      ops.push_back(*std::move(op));
    }
  }
  Enqueue(std::move(ops), epoch);
  absl::MutexLock lock(&mu_);
  if (GoneLocked(epoch)) return;
  machine_.Restored();
  UpdateOpenTagLocked();
  // The session that just ended, and any before it whose own restore a
  // quick second end cut short: this reconnect is theirs too.
  const absl::Time now = options_.clock->Now();
  for (auto it = ends_.rbegin(); it != ends_.rend(); ++it) {
    SessionEnd& end = *it;
    if (end.reconnected || !end.gave_up.empty()) break;
    end.reconnected = true;
    end.new_client_id = client_id();
    end.reconnected_at = now;
    end.slices_restored = counts.slices_restored;
    end.slices_lost = counts.slices_lost;
    end.programs_restored = counts.programs_restored;
    end.programs_lost = counts.programs_lost;
    SPDLOG_WARN("{}", DescribeSessionEnd(end));
  }
}

void ClientSession::ResumeRestore(const std::shared_ptr<SessionTag>& tag) {
  const uint64_t epoch = tag->epoch;
  // What this session holds, and the calls it sent that the last server
  // may not have run everywhere (the next runs again only those whose live
  // outputs no worker gave back).
  std::vector<std::pair<uint64_t, LiveBuffer>> live;
  proto::ClientToServer resent;
  resent.set_resent(true);
  {
    absl::MutexLock kept(&kept_mu_);
    for (const auto& [id, b] : live_) {
      // Not yet queued (NoteLive): routed as a new op after the resume.
      if (b.issued) live.emplace_back(id, b);
    }
    for (const auto& [id, op] : kept_programs_) *resent.add_ops() = op;
    kept_calls_.ForEach([&](const proto::ClientToServer& batch) {
      for (const proto::ClientOp& op : batch.ops()) {
        if (op.has_call() || op.has_put()) *resent.add_ops() = op;
      }
    });
  }
  proto::ClientToServer held;
  proto::LiveBuffers* buffers = held.add_ops()->mutable_live();
  for (const auto& [id, b] : live) {
    proto::LiveBuffer* l = buffers->add_buffers();
    l->set_buffer_id(Resolve(id));
    l->set_slice_id(b.slice_id);
    *l->mutable_arg() = ToProto(b.arg);
  }
  proto::ClientToServer done;
  done.add_ops()->mutable_live()->set_done(true);
  absl::MutexLock lock(&mu_);
  pre_messages_.push_back(std::move(held));
  if (resent.ops_size() > 0) pre_messages_.push_back(std::move(resent));
  pre_messages_.push_back(std::move(done));
  // Ops queued from now on go after these, as new ops of the session.
  restoring_ = false;
  auto written = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return GoneLocked(epoch) || (pre_messages_.empty() && !sending_);
  };
  mu_.Await(absl::Condition(&written));
  if (GoneLocked(epoch)) return;  // the next reconnect tries again
  machine_.Restored();
  UpdateOpenTagLocked();
}

bool ClientSession::RestoreSlice(Slice& slice, uint64_t epoch,
                                 Restored& counts) {
  Clock& clock = *options_.clock;
  const SliceOptions& o = slice.options();
  proto::SliceRequest req = ToProto(o);
  // The slices it avoids, by their ids in this session: each was made
  // before it, so asked for again before it (or gone: dropped).
  req.clear_avoid_slices();
  for (const std::weak_ptr<Slice>& w : slice.avoided()) {
    std::shared_ptr<Slice> other = w.lock();
    if (other != nullptr && other->epoch() == epoch) {
      req.add_avoid_slices(other->id());
    }
  }
  const uint64_t last_id = slice.id();
  // A restarted server knows no worker until they rejoin (by their own
  // back-off): a request naming a host is refused until that host is
  // back. So a refused request is made again, with back-off, until the
  // slice's own timeout passes (each one waits at the server for
  // capacity as any request does).
  const absl::Time deadline = clock.Now() + o.timeout;
  BackoffOptions retry_options;
  retry_options.initial = absl::Milliseconds(100);
  retry_options.cap = absl::Seconds(1);
  retry_options.give_up_after = o.timeout;
  Backoff retry(retry_options);
  absl::StatusOr<proto::SliceInfo> info;
  for (;;) {
    req.set_timeout_ms(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(deadline - clock.Now())));
    info = RequestSlice(req, epoch);
    if (info.ok() || Gone(epoch)) break;
    std::optional<absl::Duration> delay = retry.NextDelay(clock.Now());
    if (!delay.has_value() || clock.Now() + *delay >= deadline) break;
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || machine_.broken();
    };
    clock.AwaitCondition(&mu_, absl::Condition(&ended), clock.Now() + *delay);
  }
  if (!info.ok() && Gone(epoch)) return false;
  if (!info.ok()) {
    slice.MarkLost(absl::UnavailableError(absl::StrCat(
        "slice ", last_id, " could not be granted again after the server at ",
        address_, " restarted: ", info.status().message())));
    counts.slices_lost++;
    return true;
  }
  slice.Rebind(*info, epoch);
  AddSlice(&slice);
  counts.slices_restored++;
  return true;
}

std::optional<proto::ClientOp> ClientSession::RestoreProgram(
    Program& program, uint64_t epoch,
    const absl::flat_hash_map<const Slice*, proto::SliceInfo>& before,
    Restored& counts) {
  const std::string what = absl::StrCat("program '", program.name(), "'");
  const std::shared_ptr<Slice>& slice = program.slice();
  if (slice->epoch() != epoch) {
    absl::Status why = slice->lost();
    if (why.ok()) why = absl::FailedPreconditionError("its slice was closed");
    program.MarkLost(
        absl::Status(why.code(), absl::StrCat(what, ": ", why.message())));
    counts.programs_lost++;
    return std::nullopt;
  }
  proto::ProgramDef def = program.def();
  auto it = before.find(slice.get());
  if (def.has_xla() && it != before.end()) {
    absl::Status rebound =
        RebindIslands(it->second, slice->info(), def.mutable_xla());
    if (!rebound.ok()) {
      program.MarkLost(absl::FailedPreconditionError(absl::StrCat(
          what,
          " cannot run on its slice as granted again after the "
          "server at ",
          address_, " restarted: ", rebound.message(), "; compile it again")));
      counts.programs_lost++;
      return std::nullopt;
    }
  }
  absl::StatusOr<uint64_t> id = NextIds();
  if (!id.ok()) {
    program.MarkLost(absl::Status(
        id.status().code(), absl::StrCat(what, ": ", id.status().message())));
    counts.programs_lost++;
    return std::nullopt;
  }
  proto::ClientOp op;
  op.mutable_program()->set_program_id(*id);
  *op.mutable_program()->mutable_program() = std::move(def);
  program.Rebind(*id, epoch);
  counts.programs_restored++;
  return op;
}

}  // namespace plexus
