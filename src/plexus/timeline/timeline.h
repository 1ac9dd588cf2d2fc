// The timeline: what each process did and when, in a bounded ring that is
// always on. The server records one event per call (routed to done,
// whatever the hosts it spans), the time each call waited at admission and
// each recovery step; a worker records its shard tasks, compiles and
// executable loads, the transfers it sends (with the path each took) and
// the puts, fetches and waits it serves. `plexus trace` and
// `client.trace(path)` collect the rings through the server (Trace RPC),
// which aligns the hosts' clocks (timeline/clock_offset.h), and write a
// Chrome trace-event file (timeline/chrome_trace.h) that Perfetto and
// TensorBoard open.
//
// The client records its own side too (client/client_core.h): each put,
// fetch and wait it made and each call it issued; `client.trace(path)`
// adds that ring to the trace it collects.
//
// Costs: Record() takes one uncontended mutex and copies one 88-byte event;
// nothing allocates after construction. The ring holds the last
// `capacity` events: memory is capacity * sizeof(TimelineEvent) whatever
// the job's length (the oldest events are overwritten; `dropped()` counts
// them).
//
// Times are nanoseconds on the process's timeline clock: its injected
// Clock (common/clock.h; the wall clock outside tests) plus `skew`, which
// only tests set, to give each process a clock of its own.
//
// Thread-safe: any thread may record while another collects.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"

namespace plexus {

// What an event is; the numbers travel (TimelineEvent.kind) and must not
// change.
enum class EventKind : uint8_t {
  kNone = 0,
  // Server.
  kCall = 1,           // routed -> its last worker reported it done
  kAdmissionWait = 2,  // routed -> admitted to the workers
  kRecovery = 3,       // a recovery step; `label` says which
  kResize = 4,         // a slice resized, its moves routed; `label` says how
  // Worker.
  kTask = 10,      // one shard task on `device`: started -> done
  kCompile = 11,   // an XLA executable compiled (`label`: the program)
  kLoad = 12,      // an XLA executable loaded from a peer's bytes
  kTransfer = 13,  // a shard sent to worker `peer` (queued -> delivered)
  kPut = 14,       // a client's shard stored (served on the data plane)
  kFetch = 15,     // a shard sent to a client
  kWait = 16,      // a client's wait answered
  // Client (its own ring): kCall (issued: its ops built -> queued to the
  // server), kPut, kFetch and kWait (made -> returned).
};

// The path a transfer took (TransferPaths, store/device_buffer.h).
enum class TransferPath : uint8_t {
  kNone = 0,
  kAlias = 1,           // read in place on its own device
  kDeviceToDevice = 2,  // copied between two devices of this worker
  kIpc = 3,             // CUDA IPC to a worker of this host
  kSharedMemory = 4,    // a memfd over a unix socket (same machine)
  kTcp = 5,             // bytes over TCP
  kNccl = 6,            // summed on the GPUs by NCCL
};
// The paths that move nothing between workers (a transfer event on the
// reading worker: `peer` is the worker itself).
inline bool IsLocalPath(TransferPath path) {
  return path == TransferPath::kAlias ||
         path == TransferPath::kDeviceToDevice || path == TransferPath::kNccl;
}

const char* EventKindName(EventKind kind);
const char* TransferPathName(TransferPath path);

// One event. Ids a kind does not have are 0 (device and shard: -1).
struct TimelineEvent {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t client_id = 0;
  uint64_t call_id = 0;  // the client's call id (Call.call_id)
  uint64_t program_id = 0;
  uint64_t buffer_id = 0;
  uint64_t graph_id = 0;  // kCall: the client's graph (Call.graph_id)
  int64_t peer = 0;       // transfer: the destination worker
  // transfer, put, fetch: bytes moved. kAdmissionWait: the device time
  // the call was charged, in µs (shown as `charged_us`).
  int64_t bytes = 0;
  int32_t device = -1;
  int32_t shard = -1;
  uint32_t label = 0;  // Timeline::Intern()ed text, or a call site (kCall)
  EventKind kind = EventKind::kNone;
  TransferPath path = TransferPath::kNone;
  bool failed = false;
};
static_assert(sizeof(TimelineEvent) == 88, "a ring slot: keep it small");

class Timeline {
 public:
  struct Options {
    size_t capacity = size_t{1} << 16;  // events kept (rounded up to 2^k)
    Clock* clock = Clock::Real();       // not owned
    absl::Duration skew;                // TEST ONLY: added to every time
    bool enabled = true;
  };
  explicit Timeline(Options options);
  Timeline() : Timeline(Options{}) {}
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // The timeline clock now.
  int64_t NowNs() const {
    return absl::ToUnixNanos(options_.clock->Now() + options_.skew);
  }

  // A time read from the real clock (absl::Now, as the task runner reads
  // its times) on the timeline clock: the same reading, skewed, where the
  // timeline's clock is the real one (outside tests with a fake clock).
  int64_t At(absl::Time t) const {
    return absl::ToUnixNanos(t + options_.skew);
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }

  // Keeps `event`, overwriting the oldest when full. A no-op when disabled.
  void Record(const TimelineEvent& event);

  // The events kept that end at or after `since_ns`, oldest first.
  std::vector<TimelineEvent> Since(int64_t since_ns) const;

  // An id for `text`, the same every time (0: ""). At most kMaxLabels
  // distinct texts; past that every new one is 0.
  uint32_t Intern(absl::string_view text);
  // The text of a label id ("" for an unknown one).
  std::string Label(uint32_t id) const;

  size_t capacity() const { return capacity_; }
  uint64_t recorded() const;  // events ever recorded
  uint64_t dropped() const;   // overwritten: the ring was full

  static constexpr size_t kMaxLabels = 4096;

 private:
  const Options options_;
  std::atomic<bool> enabled_;
  const size_t capacity_;  // ring_'s size, fixed: a power of two
  mutable absl::Mutex mu_;
  std::vector<TimelineEvent> ring_ ABSL_GUARDED_BY(mu_);  // fixed size 2^k
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;  // events ever recorded
  mutable absl::Mutex labels_mu_;
  std::vector<std::string> labels_ ABSL_GUARDED_BY(labels_mu_);
  absl::flat_hash_map<std::string, uint32_t> label_ids_
      ABSL_GUARDED_BY(labels_mu_);
};

// The events a process's ring keeps: $PLEXUS_TIMELINE_EVENTS if set (0:
// recording off), else the default (65536, about 5.5 MiB).
size_t TimelineEventsFromEnv();

// TEST ONLY: the skew $PLEXUS_TEST_TIMELINE_SKEW_MS gives process `name`
// ("server", or a worker's host name): "server=120,host0=-350" (ms). Zero
// where it names none.
absl::Duration TestSkewFromEnv(absl::string_view name);

// Records the interval from its construction to its end (or to Done()).
// Fill `event` meanwhile; start_ns is set at construction.
class ScopedEvent {
 public:
  ScopedEvent(Timeline* timeline, EventKind kind)
      : timeline_(timeline != nullptr && timeline->enabled() ? timeline
                                                             : nullptr) {
    event.kind = kind;
    if (timeline_ != nullptr) event.start_ns = timeline_->NowNs();
  }
  ~ScopedEvent() { Done(); }
  ScopedEvent(const ScopedEvent&) = delete;
  ScopedEvent& operator=(const ScopedEvent&) = delete;
  void Done() {
    if (timeline_ == nullptr) return;
    event.end_ns = timeline_->NowNs();
    timeline_->Record(event);
    timeline_ = nullptr;
  }
  // Where it will be recorded (null: nowhere).
  Timeline* timeline() const { return timeline_; }
  // Stops it from being recorded here; returns where it would have been
  // (its taker records it, with its end: a parked answer's event).
  Timeline* Dismiss() { return std::exchange(timeline_, nullptr); }
  TimelineEvent event;

 private:
  Timeline* timeline_;
};

}  // namespace plexus
