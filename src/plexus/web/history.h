// History: what the live page plots over the last minutes, sampled from
// the cluster's status at a fixed period (WebServer: once a second) into a
// ring of fixed capacity, so its memory is bounded whatever the job's
// length. Pure data; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus::web {

struct Sample {
  int64_t unix_ms = 0;
  int64_t calls_routed = 0;
  int64_t calls_waiting = 0;  // why entries
  struct Device {
    int64_t worker_id = 0;
    int32_t index = 0;
    int64_t busy_micros = 0;  // since the worker started
    int64_t live_bytes = 0;
    int64_t memory_bytes = 0;  // capacity
  };
  std::vector<Device> devices;  // of live workers
  // Summed over live workers, since each started (the page plots rates).
  int64_t bytes_sent = 0;     // data plane, worker to worker
  int64_t bytes_clients = 0;  // from and to clients
  // Bytes by transfer path (WorkerStats.transfer_bytes), in
  // kTransferPaths' order.
  int64_t transfer_bytes[6] = {};
  int64_t hosts_lost = 0;

  static Sample Of(const proto::ClusterStatus& status, int64_t unix_ms);
};

inline constexpr const char* kTransferPaths[6] = {
    "alias", "device_to_device", "ipc", "shared_memory", "tcp", "nccl"};

class History {
 public:
  explicit History(size_t capacity) : capacity_(capacity) {}
  void Add(Sample sample);
  // The samples taken after `unix_ms` (all: 0), oldest first.
  std::vector<Sample> Since(int64_t unix_ms) const;
  size_t size() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<Sample> samples_ ABSL_GUARDED_BY(mu_);
};

// `samples` as the JSON the page reads: {"t": [...], "calls_routed": [...],
// "devices": {"<worker>/<index>": {"busy_micros": [...], "live_bytes": [...],
// "memory_bytes": n}}, "transfer_bytes": {"<path>": [...]}, ...}, one array
// element per sample.
std::string HistoryJson(const std::vector<Sample>& samples);

}  // namespace plexus::web
