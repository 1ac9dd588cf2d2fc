#include "plexus/web/history.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace plexus::web {

Sample Sample::Of(const proto::ClusterStatus& status, int64_t unix_ms) {
  Sample s;
  s.unix_ms = unix_ms;
  s.calls_routed = status.calls_routed();
  s.calls_waiting = status.why_size();
  s.hosts_lost = status.recovery().hosts_lost();
  for (const proto::WorkerStatus& w : status.workers()) {
    if (!w.alive()) continue;
    const proto::WorkerStats& st = w.stats();
    for (const proto::DeviceInfo& d : w.devices()) {
      Device dev;
      dev.worker_id = w.worker_id();
      dev.index = d.index();
      const int i = d.index();
      if (i >= 0 && i < st.device_busy_micros_size()) {
        dev.busy_micros = st.device_busy_micros(i);
      }
      if (i >= 0 && i < st.device_live_bytes_size()) {
        dev.live_bytes = st.device_live_bytes(i);
      }
      dev.memory_bytes = d.memory_bytes();
      s.devices.push_back(dev);
    }
    s.bytes_sent += st.bytes_sent();
    s.bytes_clients += st.bytes_from_clients() + st.bytes_to_clients();
    const proto::TransferBytes& b = st.transfer_bytes();
    const int64_t by_path[6] = {b.alias(), b.device_to_device(),
                                b.ipc(),   b.shared_memory(),
                                b.tcp(),   b.nccl()};
    for (int p = 0; p < 6; ++p) s.transfer_bytes[p] += by_path[p];
  }
  return s;
}

void History::Add(Sample sample) {
  absl::MutexLock lock(&mu_);
  samples_.push_back(std::move(sample));
  while (samples_.size() > capacity_) samples_.pop_front();
}

std::vector<Sample> History::Since(int64_t unix_ms) const {
  absl::MutexLock lock(&mu_);
  std::vector<Sample> out;
  for (const Sample& s : samples_) {
    if (s.unix_ms > unix_ms) out.push_back(s);
  }
  return out;
}

size_t History::size() const {
  absl::MutexLock lock(&mu_);
  return samples_.size();
}

std::string HistoryJson(const std::vector<Sample>& samples) {
  using nlohmann::json;
  json t = json::array(), routed = json::array(), waiting = json::array(),
       sent = json::array(), clients = json::array(), lost = json::array();
  json transfers = json::object();
  for (const char* p : kTransferPaths) transfers[p] = json::array();
  json devices = json::object();
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    t.push_back(s.unix_ms);
    routed.push_back(s.calls_routed);
    waiting.push_back(s.calls_waiting);
    sent.push_back(s.bytes_sent);
    clients.push_back(s.bytes_clients);
    lost.push_back(s.hosts_lost);
    for (int p = 0; p < 6; ++p) {
      transfers[kTransferPaths[p]].push_back(s.transfer_bytes[p]);
    }
    for (const Sample::Device& d : s.devices) {
      json& dev = devices[absl::StrCat(d.worker_id, "/", d.index)];
      if (dev.is_null()) {
        // A device that appeared later: null where it was not sampled.
        dev["busy_micros"] = json::array();
        dev["live_bytes"] = json::array();
        for (size_t j = 0; j < i; ++j) {
          dev["busy_micros"].push_back(nullptr);
          dev["live_bytes"].push_back(nullptr);
        }
      }
      dev["busy_micros"].push_back(d.busy_micros);
      dev["live_bytes"].push_back(d.live_bytes);
      dev["memory_bytes"] = d.memory_bytes;
    }
    // A device that went: null from here on.
    for (auto& [key, dev] : devices.items()) {
      while (dev["busy_micros"].size() < i + 1) {
        dev["busy_micros"].push_back(nullptr);
        dev["live_bytes"].push_back(nullptr);
      }
    }
  }
  json out = {{"t", t},
              {"calls_routed", routed},
              {"calls_waiting", waiting},
              {"bytes_sent", sent},
              {"bytes_clients", clients},
              {"hosts_lost", lost},
              {"transfer_bytes", transfers},
              {"devices", devices}};
  return out.dump();
}

}  // namespace plexus::web
