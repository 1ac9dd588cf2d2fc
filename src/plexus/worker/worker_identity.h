// Who this worker is to the server and its peers: the cluster secret it
// proves itself with, its machine, and the id and generation the server
// gave this registration. The parts of the worker (worker_impl.h) hold it
// by reference; the coordinator sets it up (StartLocal) and the server
// session fills in the id and generation (its first message).
//
// Thread-safety: `secret` and `machine_id` are written before any part
// starts and only read after; the id and generation are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "plexus/common/credentials.h"
#include "plexus/transport/data_plane.h"

namespace plexus {

struct WorkerIdentity {
  ClusterSecret secret;  // WorkerOptions.secret, or one of its own
  // LocalMachineId(): peers with the same one are reached by shared memory.
  std::string machine_id;
  std::atomic<int64_t> worker_id{-1};  // -1 until the server names it
  // This registration's, from the server's first message (0 without one).
  std::atomic<uint64_t> generation{0};

  // How this worker opens data-plane connections to its peers: as a
  // worker, its frames stamped with this registration's generation (peers
  // fence it once it is declared down).
  transport::DataPlaneIdentity AsPeer() const {
    transport::DataPlaneIdentity me;
    me.peer = {CredentialRole::kWorker, 0};
    me.credential = secret.Derive(CredentialRole::kWorker);
    me.generation = generation.load();
    return me;
  }
};

}  // namespace plexus
