#include "plexus/timeline/timeline.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace plexus {

const char* EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kCall:
      return "call";
    case EventKind::kAdmissionWait:
      return "admission wait";
    case EventKind::kRecovery:
      return "recovery";
    case EventKind::kResize:
      return "resize";
    case EventKind::kTask:
      return "task";
    case EventKind::kCompile:
      return "compile";
    case EventKind::kLoad:
      return "load";
    case EventKind::kTransfer:
      return "transfer";
    case EventKind::kPut:
      return "put";
    case EventKind::kFetch:
      return "fetch";
    case EventKind::kWait:
      return "wait";
    case EventKind::kNone:
      break;
  }
  return "event";
}

const char* TransferPathName(TransferPath path) {
  switch (path) {
    case TransferPath::kAlias:
      return "alias";
    case TransferPath::kDeviceToDevice:
      return "device-to-device";
    case TransferPath::kIpc:
      return "ipc";
    case TransferPath::kSharedMemory:
      return "shared memory";
    case TransferPath::kTcp:
      return "tcp";
    case TransferPath::kNccl:
      return "nccl";
    case TransferPath::kNone:
      break;
  }
  return "";
}

size_t TimelineEventsFromEnv() {
  const char* env = std::getenv("PLEXUS_TIMELINE_EVENTS");
  size_t n = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &n)) return n;
  return Timeline::Options{}.capacity;
}

absl::Duration TestSkewFromEnv(absl::string_view name) {
  const char* env = std::getenv("PLEXUS_TEST_TIMELINE_SKEW_MS");
  if (env == nullptr) return absl::ZeroDuration();
  for (absl::string_view item : absl::StrSplit(env, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    double ms = 0;
    if (kv.first == name && absl::SimpleAtod(kv.second, &ms)) {
      return absl::Milliseconds(ms);
    }
  }
  return absl::ZeroDuration();
}

namespace {

size_t RoundUpToPowerOfTwo(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

Timeline::Timeline(Options options)
    : options_(options),
      enabled_(options.enabled),
      capacity_(RoundUpToPowerOfTwo(std::max<size_t>(options.capacity, 1))),
      ring_(capacity_) {
  labels_.emplace_back();  // id 0: ""
}

void Timeline::Record(const TimelineEvent& event) {
  if (!enabled()) return;
  absl::MutexLock lock(&mu_);
  ring_[next_ & (ring_.size() - 1)] = event;
  ++next_;
}

std::vector<TimelineEvent> Timeline::Since(int64_t since_ns) const {
  std::vector<TimelineEvent> out;
  absl::MutexLock lock(&mu_);
  const uint64_t kept = std::min<uint64_t>(next_, ring_.size());
  out.reserve(kept);
  for (uint64_t i = next_ - kept; i < next_; ++i) {
    const TimelineEvent& e = ring_[i & (ring_.size() - 1)];
    if (e.end_ns >= since_ns) out.push_back(e);
  }
  return out;
}

uint32_t Timeline::Intern(absl::string_view text) {
  if (text.empty()) return 0;
  absl::MutexLock lock(&labels_mu_);
  auto it = label_ids_.find(std::string(text));
  if (it != label_ids_.end()) return it->second;
  if (labels_.size() >= kMaxLabels) return 0;
  const uint32_t id = static_cast<uint32_t>(labels_.size());
  labels_.emplace_back(text);
  label_ids_.emplace(std::string(text), id);
  return id;
}

std::string Timeline::Label(uint32_t id) const {
  absl::MutexLock lock(&labels_mu_);
  return id < labels_.size() ? labels_[id] : std::string();
}

uint64_t Timeline::recorded() const {
  absl::MutexLock lock(&mu_);
  return next_;
}

uint64_t Timeline::dropped() const {
  absl::MutexLock lock(&mu_);
  return next_ > ring_.size() ? next_ - ring_.size() : 0;
}

}  // namespace plexus
