// Relayed answers (DataPath): the client's half of transport/relay_links.h.
// A call made right after a wait (a blocking round trip's) goes with
// Call.relay where its outputs are small and a relay link is open to each
// worker of its slice; its fetch then reads the worker's answer on the
// link, with no FETCH sent and no worker thread woken to park one. Any
// doubt (no link, the link busy or ended, a SKIP, no answer in time)
// falls back to the fetch as it always was.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/client/data_path.h"
#include "plexus/client/fetch_plan.h"
#include "plexus/common/logging.h"

namespace plexus {
namespace {

// A relayed answer is due at once (the call's outputs are decided on the
// worker, which relays each); past this, something was missed (say, the
// server routed the call again where no link is): the fetch asks instead.
constexpr absl::Duration kRelayWait = absl::Seconds(30);
// The relay's own round trip, once per worker: a worker that does not
// answer at once is not waited on (the fetch that opened it is done).
constexpr absl::Duration kLinkWait = absl::Seconds(1);
// Outputs of relayed calls remembered until read (the oldest forgotten
// first: fetched as before, their answers dropped from the link).
constexpr size_t kRelayedIds = 4096;
// Answers read for other keys, kept with the link for their readers.
constexpr size_t kStashed = 64;

}  // namespace

struct DataPath::RelayLink {
  explicit RelayLink(std::unique_ptr<transport::DataPlaneConnection> c)
      : conn(std::move(c)) {}
  const std::unique_ptr<transport::DataPlaneConnection> conn;
  absl::Mutex mu;  // held by the thread reading it
  std::deque<transport::DataPlaneConnection::Relayed> stash ABSL_GUARDED_BY(mu);
};

DataPath::Relay DataPath::RelayCall(const proto::SliceInfo& slice,
                                    absl::Span<const ArgSpec> outputs,
                                    absl::Span<const uint64_t> ids) {
  if (!options_.relay_answers || outputs.empty()) return Relay::kNone;
  const int n = slice.devices_size();
  bool every = false;  // an output whose fetch reads every shard
  bool first = false;  // an output whose fetch reads one replica
  for (const ArgSpec& out : outputs) {
    absl::StatusOr<TensorSpec> local = out.Local(n);
    if (!local.ok() ||
        local->byte_size() >
            static_cast<int64_t>(transport::kRelayedValueBytes)) {
      return Relay::kNone;
    }
    absl::StatusOr<FetchPlan> plan = PlanFetch(out, n);
    if (!plan.ok()) return Relay::kNone;
    if (static_cast<int>(plan->reads.size()) == n) {
      every = true;
    } else if (plan->reads.size() == 1) {
      first = true;  // reads shard 0
    } else {
      return Relay::kNone;  // a mesh's replicated blocks: fetched
    }
  }
  // Replicas of one output beside every shard of another: the replicas'
  // answers would wait on their links unread. Fetched.
  if (every && first) return Relay::kNone;
  const Relay relay = first ? Relay::kFirstShard : Relay::kEveryShard;
  absl::MutexLock lock(&mu_);
  if (!usable_ || links_.empty()) return Relay::kNone;
  for (int j = 0; j < (first ? 1 : n); ++j) {
    if (!links_.contains(slice.devices(j).worker_id())) return Relay::kNone;
  }
  for (uint64_t id : ids) {
    if (relayed_.emplace(id, first).second) relayed_order_.push_back(id);
  }
  while (relayed_order_.size() > kRelayedIds) {
    relayed_.erase(relayed_order_.front());
    relayed_order_.pop_front();
  }
  return relay;
}

bool DataPath::IsRelayedLocked(const ShardKey& key) const {
  auto relayed = relayed_.find(key.buffer_id);
  // Not relayed, or not this shard (a replica a fetch does not read).
  return relayed != relayed_.end() && !(relayed->second && key.shard != 0);
}

bool DataPath::IsRelayed(const ShardKey& key) const {
  absl::MutexLock lock(&mu_);
  return IsRelayedLocked(key);
}

std::optional<absl::StatusOr<std::shared_ptr<Storage>>> DataPath::AwaitRelayed(
    int64_t worker, const ShardKey& key, bool keep, absl::Time deadline,
    bool* timed_out) {
  std::shared_ptr<RelayLink> link;
  {
    absl::MutexLock lock(&mu_);
    if (!IsRelayedLocked(key)) return std::nullopt;
    auto it = links_.find(worker);
    if (it == links_.end()) return std::nullopt;
    link = it->second;
  }
  if (!link->mu.TryLock()) return std::nullopt;  // another reader: fetch
  auto matches = [&key](const transport::ShardKey& k) {
    return k.buffer_id == key.buffer_id &&
           (k.shard == key.shard || k.shard < 0);
  };
  std::optional<absl::StatusOr<std::shared_ptr<Storage>>> answer;
  bool found = false;
  for (auto it = link->stash.begin(); it != link->stash.end(); ++it) {
    if (!matches(it->key)) continue;
    answer = it->result;
    if (!keep) link->stash.erase(it);
    found = true;
    break;
  }
  // Answers pushed out of the stash unread: their buffers are fetched.
  std::vector<uint64_t> evicted;
  // On the connection's clock (Checkout's connections keep the real one).
  const absl::Time backstop = Clock::Real()->Now() + kRelayWait;
  const bool callers = deadline < backstop;
  while (!found) {
    absl::StatusOr<transport::DataPlaneConnection::Relayed> got =
        link->conn->ReadRelayed(callers ? deadline : backstop);
    if (callers && absl::IsDeadlineExceeded(got.status()) &&
        link->conn->healthy()) {
      // The caller's time is up, not the link's: its answer is still due.
      link->mu.Unlock();
      if (timed_out != nullptr) *timed_out = true;
      return std::nullopt;
    }
    if (!got.ok()) {
      // Ended (its worker, the session, a worker that shut it) or silent:
      // the fetch asks the worker, which still answers.
      if (absl::IsDeadlineExceeded(got.status())) {
        SPDLOG_WARN("relay: no answer for {} from worker {} in {}: fetching it",
                    KeyString(key), worker, absl::FormatDuration(kRelayWait));
      }
      link->mu.Unlock();
      DropLink(worker, link);
      return std::nullopt;
    }
    if (!matches(got->key)) {
      link->stash.push_back(std::move(*got));
      if (link->stash.size() > kStashed) {
        evicted.push_back(link->stash.front().key.buffer_id);
        link->stash.pop_front();
      }
      continue;
    }
    answer = std::move(got->result);
    if (keep) link->stash.push_back({got->key, answer});
    found = true;
  }
  link->mu.Unlock();
  if (!evicted.empty()) {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : evicted) relayed_.erase(id);  // order entries age out
  }
  if (!answer.has_value()) return std::nullopt;  // SKIP: fetch it
  answers_relayed.fetch_add(1, std::memory_order_relaxed);
  return answer;
}

void DataPath::ForgetRelayed(uint64_t id) {
  absl::MutexLock lock(&mu_);
  relayed_.erase(id);  // its order entry ages out
}

void DataPath::MaybeLink(const proto::SliceDevice& device, uint64_t epoch) {
  if (!options_.relay_answers) return;
  const int64_t worker = device.worker_id();
  {
    absl::MutexLock lock(&mu_);
    if (!UsableLocked(epoch) || links_.contains(worker) ||
        !unlinked_.insert(worker).second) {
      return;
    }
  }
  // unlinked_ holds it meanwhile: one attempt per worker and session.
  auto conn = Checkout(device, epoch);
  if (!conn.ok()) return;
  absl::Status opened = (*conn)->OpenRelay(Clock::Real()->Now() + kLinkWait);
  absl::MutexLock lock(&mu_);
  // Out of the pool's care: a link is woken by DropLinksLocked.
  in_use_.erase(conn->get());
  if (!opened.ok()) {
    SPDLOG_DEBUG("relay: worker {} takes no link: {}", worker,
                 opened.ToString());
    return;  // closed here; the worker is not asked again this session
  }
  if (!UsableLocked(epoch) || workers_down_.contains(worker)) return;
  unlinked_.erase(worker);
  links_[worker] = std::make_shared<RelayLink>(std::move(*conn));
  relay_links_opened.fetch_add(1, std::memory_order_relaxed);
}

void DataPath::DropLinksLocked(int64_t worker) {
  for (auto it = links_.begin(); it != links_.end();) {
    if (worker >= 0 && it->first != worker) {
      ++it;
      continue;
    }
    it->second->conn->Shutdown();  // wakes its reader
    links_.erase(it++);
  }
  if (links_.empty()) {
    relayed_.clear();
    relayed_order_.clear();
  }
}

void DataPath::DropLink(int64_t worker,
                        const std::shared_ptr<RelayLink>& link) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(worker);
  if (it != links_.end() && it->second == link) DropLinksLocked(worker);
}

}  // namespace plexus
