// ClientCore: builds the client's session and data path, wires the one to
// the other, and holds what both share (timeline, call sites, counters).
#include "plexus/client/client_core.h"

namespace plexus {
namespace {

Timeline::Options ClientTimelineOptions(Clock* clock) {
  Timeline::Options options;
  options.clock = clock;
  options.capacity = TimelineEventsFromEnv();
  options.enabled = options.capacity > 0;
  options.skew = TestSkewFromEnv("client");
  return options;
}

}  // namespace

uint32_t CallSites::Id(const std::string& text) {
  absl::MutexLock lock(&mu_);
  auto it = site_ids_.find(text);
  if (it != site_ids_.end()) return it->second;
  if (sites_.size() >= kMaxCallSites) return 0;
  sites_.push_back(text);
  const uint32_t id = static_cast<uint32_t>(sites_.size());
  site_ids_.emplace(text, id);
  return id;
}

bool CallSites::Op(uint32_t site, uint64_t epoch, proto::ClientOp* op) {
  absl::MutexLock lock(&mu_);
  if (site == 0 || site > sites_.size()) return false;
  if (epoch != sites_epoch_) {
    sites_epoch_ = epoch;
    sites_sent_.assign(sites_.size(), false);
  }
  if (sites_sent_.size() < sites_.size()) sites_sent_.resize(sites_.size());
  if (sites_sent_[site - 1]) return false;
  sites_sent_[site - 1] = true;
  op->mutable_site()->set_id(site);
  op->mutable_site()->set_text(sites_[site - 1]);
  return true;
}

ClientCore::ClientCore(ClientOptions options)
    : options_(std::move(options)),
      timeline_(ClientTimelineOptions(options_.clock)),
      data_(options_, session_),
      session_(options_, &data_, [this](proto::ClientStats* s) {
        s->set_bytes_put(data_.bytes_put.load());
        s->set_bytes_fetched(data_.bytes_fetched.load());
        s->set_calls(calls.load());
        s->set_live_futures(live_futures.load());
      }) {}

ClientCore::~ClientCore() { Close(); }

absl::Status ClientCore::Init(const std::string& address) {
  return session_.Open(address);
}

void ClientCore::Close() {
  // The session flushes what is queued, then ends; the server frees the
  // client's slices and buffers when the stream ends.
  session_.Close();
  data_.Clear();
}

}  // namespace plexus
