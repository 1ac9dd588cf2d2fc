// WebServer: the server's live page and /metrics over HTTP (civetweb), on
// an address of its own beside the gRPC port (ServerOptions::web_listen).
//
//   GET /            the live page (web/page/: hosts and devices with busy
//                    time and memory over the last minutes, slices and
//                    their clients, calls waiting and why, admission and
//                    tenants' shares, transfers by path, recoveries)
//   GET /app.js, /style.css, /chart.js   its static files (assets.h)
//   GET /api/status  JSON: {"viewer", "now_ms", "status": ClusterStatus as
//                    protobuf's JSON mapping, "history": HistoryJson of
//                    the samples after ?since=MS}
//   GET /metrics     Prometheus text format (metrics.h)
//
// Read-only. /api/status and /metrics need a token (viewer.h) and show a
// tenant only its own clients; the static files need none and hold no
// data. Answers carry a Content-Security-Policy that lets the page load
// only from this server.
//
// Start reads the status (without its why list) once into the History
// the page plots, before it serves anything; a sampler thread then reads
// it once every sample_period; it sleeps between samples. civetweb reads
// requests on `threads` threads of its own and hands each to one thread of ours
// that answers them in turn (civetweb's threads have small stacks).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/credentials.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/web/history.h"

namespace plexus::web {

struct WebOptions {
  // HOST:PORT (port 0: a free one). HOST is an IPv4 address, "localhost"
  // or a bracketed IPv6 address.
  std::string listen = "127.0.0.1:0";
  int threads = 2;
  absl::Duration sample_period = absl::Seconds(1);
  size_t history_samples = 300;  // five minutes at one a second
  Clock* clock = Clock::Real();  // not owned
};

// What the page shows, read from the server on each request and sample:
// the status GetStatus answers, with its why list when `why` is set.
// Called on civetweb's threads and the sampler's, concurrently.
using StatusSource = std::function<proto::ClusterStatus(bool why)>;

class WebServer {
 public:
  // Listens and starts the sampler. Unavailable naming the address and
  // civetweb's reason when it cannot listen.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(
      const WebOptions& options, const ClusterSecret& secret,
      StatusSource source);
  // Stops serving (waits for requests being answered) and the sampler.
  ~WebServer();

  // "HOST:PORT" it listens on, with the port it was given.
  std::string address() const { return address_; }
  const History& history() const { return history_; }

  // The answer to one request, for the HTTP handler and tests: status
  // code, content type and body. `authorization` is the header's value
  // ("" if absent).
  struct Response {
    int code = 200;
    std::string content_type;
    std::string body;
  };
  Response Handle(const std::string& method, const std::string& path,
                  const std::string& query, const std::string& authorization);

 private:
  WebServer(const WebOptions& options, const ClusterSecret& secret,
            StatusSource source);
  // Reads the status (without its why list) into the history, stamped
  // with the clock as the read began.
  void TakeSample();
  // Takes a sample at first + k * sample_period (k >= 1) until stopped.
  void SampleLoop(absl::Time first);

  const WebOptions options_;
  const ClusterSecret secret_;
  const StatusSource source_;
  History history_;
  std::string address_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace plexus::web
