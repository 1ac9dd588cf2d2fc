// /metrics: the cluster's status (proto::ClusterStatus, what GetStatus
// answers) in Prometheus' text exposition format (0.0.4), written by
// prometheus-cpp's serializer. Read at scrape time from the server's
// records and the workers' last heartbeats, so nothing is counted twice
// and nothing on the routing path changes.
//
// Labels: host and worker (a worker's id; a host that registers again gets
// a new one), device (its index on the worker), client and client_name,
// tenant, path (transfer path), state. Counters end in _total and count
// since the process that reports them started (a worker's since it
// registered). Every family, with its type and help, is in
// MetricFamilies() below; deploy/grafana/plexus.json plots them and a test
// checks it names no other.
#pragma once

#include <string>
#include <vector>

#include "plexus/proto/plexus.pb.h"

namespace plexus::web {

// The text /metrics serves for `status`.
std::string MetricsText(const proto::ClusterStatus& status);

// The name of every family MetricsText writes (whether or not it has a
// sample in a given status): what a dashboard may plot.
std::vector<std::string> MetricNames();

}  // namespace plexus::web
