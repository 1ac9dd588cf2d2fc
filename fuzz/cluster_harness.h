// The server's handling of client batches and worker messages, applied to a
// ClusterState without gRPC, and the promises the routed ops must keep.
// Shared by client_batch_fuzz.cc and worker_batch_fuzz.cc.
//
// ApplyClientBatch follows ServerImpl::HandleClientBatch (server_clients.cc)
// op by op; keep the two in step. The checks abort (a libFuzzer crash) with
// what was broken.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/common/status_proto.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_state.h"

namespace plexus::fuzz {

[[noreturn]] inline void Broken(const std::string& what) {
  std::fprintf(stderr, "invariant broken: %s\n", what.c_str());
  std::abort();
}

inline proto::RegisterWorker FakeHost(const std::string& name, int devices) {
  proto::RegisterWorker r;
  r.set_host_name(name);
  r.set_machine_id("fuzz-machine");
  r.set_data_address("127.0.0.1:1");
  for (int d = 0; d < devices; ++d) {
    auto* dev = r.add_devices();
    dev->set_index(d);
    dev->set_kind("cpu");
    dev->set_memory_bytes(1 << 20);
  }
  return r;
}

// What one batch did: one WorkerOps per unit (as handed to the scheduler),
// and the reply to the client.
struct BatchResult {
  std::vector<WorkerOps> units;
  proto::ServerToClient reply;
  int calls = 0;
};

// ServerImpl::HandleClientBatch, less the scheduler and the queues.
inline BatchResult ApplyClientBatch(ClusterState& state, uint64_t id,
                                    const proto::ClientToServer& msg) {
  BatchResult out;
  bool last_was_release = false;
  bool released_slice = false;
  for (const proto::ClientOp& op : msg.ops()) {
    const bool release = op.op_case() == proto::ClientOp::kRelease;
    if (!(release && last_was_release)) out.units.emplace_back();
    last_was_release = release;
    WorkerOps& ops = out.units.back();
    switch (op.op_case()) {
      case proto::ClientOp::kSliceRequest: {
        // The harness's time stands still: a request that waits is
        // answered by ServePendingSlices (a release, or the fuzzer's
        // deadline record).
        auto slice =
            state.RequestSlice(id, op.slice_request(), absl::UnixEpoch());
        if (!slice.has_value()) break;
        proto::SliceReply* r = out.reply.add_slices();
        r->set_request_id(op.slice_request().request_id());
        if (slice->ok()) {
          *r->mutable_slice() = **slice;
        } else {
          *r->mutable_error() = StatusToProto(slice->status());
        }
        break;
      }
      case proto::ClientOp::kSliceRelease:
        if (state.ReleaseSlice(id, op.slice_release()).ok()) {
          released_slice = true;
        }
        break;
      case proto::ClientOp::kSliceResize: {
        // As ServerImpl::ResizeSliceLocked: the moves are units of their own.
        auto resized = state.ChangeSlice(id, op.slice_resize());
        proto::SliceReply* r = out.reply.add_slices();
        r->set_request_id(op.slice_resize().request_id());
        if (!resized.ok()) {
          *r->mutable_error() = StatusToProto(resized.status());
          break;
        }
        *r->mutable_slice() = resized->slice;
        *out.reply.add_recoveries() = std::move(resized->note);
        for (auto& [seq, unit] : resized->work) {
          out.units.push_back(std::move(unit));
        }
        released_slice |= resized->freed_devices;
        break;
      }
      case proto::ClientOp::kProgram: {
        absl::Status s = state.RegisterClientProgram(id, op.program(), &ops);
        if (!s.ok())
          *out.reply.add_errors()->mutable_status() = StatusToProto(s);
        break;
      }
      case proto::ClientOp::kCall: {
        out.calls++;
        absl::Status s = state.RefuseOnSuspended(id, op);
        if (s.ok()) s = state.RouteCall(id, op.call(), &ops);
        if (!s.ok()) {
          proto::CallError* e = out.reply.add_errors();
          e->set_call_id(op.call().call_id());
          for (uint64_t o : op.call().output_ids()) e->add_output_ids(o);
          *e->mutable_status() = StatusToProto(s);
          state.FailCallOutputs(id, op.call(), s, &ops);
        }
        break;
      }
      case proto::ClientOp::kPut: {
        absl::Status s = state.RefuseOnSuspended(id, op);
        if (s.ok()) s = state.RoutePut(id, op.put(), &ops);
        if (!s.ok()) {
          proto::CallError* e = out.reply.add_errors();
          e->add_output_ids(op.put().buffer_id());
          *e->mutable_status() = StatusToProto(s);
        }
        break;
      }
      case proto::ClientOp::kRelease:
        state.RouteRelease(id, op.release(), &ops);
        break;
      case proto::ClientOp::kStats:
        if (ClientRecord* c = state.FindClient(id)) c->stats = op.stats();
        break;
      default:
        break;
    }
  }
  if (released_slice) {
    for (SliceAnswer& a : state.ServePendingSlices(absl::UnixEpoch())) {
      if (a.slice.ok()) a.slice->ByteSizeLong();
    }
  }
  return out;
}

// ServerImpl::RelayTransferFailure: the op sent to the destination, if any.
inline WorkerOps RelayTransferFailure(const ClusterState& state,
                                      const proto::TransferFailed& failed) {
  WorkerOps ops;
  auto dst = state.workers().find(failed.dst_worker_id());
  if (dst == state.workers().end() || !dst->second.alive) return ops;
  proto::WorkerOp op;
  *op.mutable_transfer_failed() = failed;
  ops[failed.dst_worker_id()].push_back(std::move(op));
  return ops;
}

// What ServerImpl::GetStatus reads of the state (every record described).
inline void DescribeEverything(const ClusterState& state) {
  proto::ClusterStatus status;
  for (const auto& [id, w] : state.workers()) {
    auto* ws = status.add_workers();
    ws->set_worker_id(id);
    *ws->mutable_devices() = w.info.devices();
    *ws->mutable_stats() = w.stats;
  }
  for (const auto& [id, s] : state.slices()) {
    *status.add_slices()->mutable_devices() = state.DescribeSlice(s).devices();
  }
  status.ByteSizeLong();
}

// Placement bookkeeping: every slice sits on known devices of its workers,
// and the load counters are what the live slices add up to.
inline void CheckPlacement(const ClusterState& state) {
  std::map<int64_t, std::vector<int>> load;
  std::map<int64_t, int64_t> mapped;
  for (const auto& [id, w] : state.workers()) {
    load[id].assign(w.device_load.size(), 0);
    mapped[id] = 0;
  }
  for (const auto& [sid, slice] : state.slices()) {
    if (slice.devices.empty()) Broken(absl::StrCat("slice ", sid, " is empty"));
    int64_t mesh = 1;
    for (int32_t m : slice.mesh_shape) {
      if (m <= 0) Broken(absl::StrCat("slice ", sid, " has mesh dim ", m));
      mesh *= m;
    }
    if (mesh != static_cast<int64_t>(slice.devices.size())) {
      Broken(absl::StrCat("slice ", sid, " mesh holds ", mesh, " devices"));
    }
    if (slice.axis_names.size() != slice.mesh_shape.size()) {
      Broken(absl::StrCat("slice ", sid, " axis names do not match its mesh"));
    }
    std::set<int64_t> hosts;
    for (const DeviceRef& d : slice.devices) {
      auto w = state.workers().find(d.worker_id);
      if (w == state.workers().end() || d.device < 0 ||
          d.device >= w->second.info.devices_size()) {
        Broken(absl::StrCat("slice ", sid, " names worker ", d.worker_id,
                            " device ", d.device));
      }
      load[d.worker_id][d.device]++;
      hosts.insert(d.worker_id);
    }
    for (int64_t h : hosts) mapped[h]++;
  }
  for (const auto& [id, w] : state.workers()) {
    if (w.device_load != load[id] || w.slices_mapped != mapped[id]) {
      Broken(absl::StrCat("worker ", id, " load counters disagree with its ",
                          "slices"));
    }
  }
}

// The routed ops address known workers and devices, and the pieces of each
// input fit the input they assemble.
inline void CheckOps(const ClusterState& state, const WorkerOps& ops) {
  for (const auto& [wid, list] : ops) {
    auto w = state.workers().find(wid);
    if (w == state.workers().end()) {
      Broken(absl::StrCat("ops for unknown worker ", wid));
    }
    const int devices = w->second.info.devices_size();
    auto device_ok = [&](int d) { return d >= 0 && d < devices; };
    for (const proto::WorkerOp& op : list) {
      if (op.has_declare() && !device_ok(op.declare().device())) {
        Broken(absl::StrCat("declare on device ", op.declare().device()));
      }
      if (op.has_expect() && !device_ok(op.expect().device())) {
        Broken(absl::StrCat("expect on device ", op.expect().device()));
      }
      if (op.has_transfer() &&
          state.workers().count(op.transfer().dst_worker_id()) == 0) {
        Broken("transfer to an unknown worker");
      }
      if (!op.has_execute()) continue;
      for (const proto::ShardTask& task : op.execute().tasks()) {
        if (!device_ok(task.device())) {
          Broken(absl::StrCat("task on device ", task.device()));
        }
        for (const proto::InputBinding& b : task.inputs()) {
          const auto& shape = b.local().shape();
          const int64_t rows = shape.empty() ? 1
                               : b.axis() >= 0 && b.axis() < shape.size()
                                   ? shape[b.axis()]
                                   : -1;
          if (rows < 0) Broken(absl::StrCat("binding axis ", b.axis()));
          for (const proto::Piece& p : b.pieces()) {
            if (p.src_offset() < 0 || p.dst_offset() < 0 || p.length() < 0 ||
                p.dst_offset() + p.length() > rows) {
              Broken(absl::StrCat("piece [", p.dst_offset(), ", +", p.length(),
                                  ") of an input of ", rows, " rows"));
            }
          }
        }
      }
    }
  }
}

}  // namespace plexus::fuzz
