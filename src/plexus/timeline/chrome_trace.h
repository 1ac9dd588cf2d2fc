// A collected trace (proto::TraceReply) as a Chrome trace-event JSON file,
// which Perfetto (ui.perfetto.dev) and TensorBoard's trace viewer open.
//
// Layout: one process per host (the server first), its events on the
// server's clock (each ring's offset added), in microseconds from the
// trace's first event.
//   server: async slices "call" (one per call: routed to done, named by
//     program and call site), "admission wait", and "recovery" steps.
//   a worker ("host0 (worker 1)"): one thread per device ("device 0") with
//     its shard tasks; one per peer it sends to ("to worker 2") with its
//     transfers, named by path; async slices for compiles and executable
//     loads and for the puts, fetches and waits it served to clients.
//     Transfers within the worker (read in place, copied between its
//     devices, summed by NCCL) on one thread per reading device ("device 0
//     reads").
//   a client's own ring (TimelineRing.client_id; Client::Trace adds it),
//     named by the client: async slices "call issued" (its ops built to
//     queued) and "client" (its puts, fetches and waits, made to returned).
//   flows ("s" in the transfer, "f" in the task that reads it) from each
//     transfer to the consumer's shard task on the destination device.
// A call recorded in a graph carries the graph's id ("graph" in args, on
// the server's call and the client's issue alike).
// Every slice carries its ids (client, call, program, buffer, shard,
// bytes) in "args". The top-level "plexus" object records each process's
// clock offset and its bound, events recorded and dropped.
#pragma once

#include <string>

#include "plexus/proto/plexus.pb.h"

namespace plexus {

std::string ChromeTraceJson(const proto::TraceReply& trace);

}  // namespace plexus
