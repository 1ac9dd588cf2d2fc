// Writes the seed corpus of every fuzz target: fuzz/corpus/<target>/seed-*.
// `make fuzz-corpus` runs it (after removing the old seed-* files; inputs
// kept from crashes, named regress-*, stay). Frames are written from
// transport::internal::FrameHeader and ops from the protos, and worker op
// streams are what ClusterState routes for ordinary calls, so a change of
// either format is one `make fuzz-corpus` away from a matching corpus.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/cluster_harness.h"
#include "fuzz/fuzz_support.h"
#include "plexus/executors/xla/xla_test_util.h"
#include "plexus/journal/internal/record.h"
#include "plexus/proto/plexus.pb.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/store/object_store.h"
#include "plexus/transport/internal/frame_socket.h"

namespace plexus::fuzz {
namespace {

using transport::internal::FrameHeader;
using transport::internal::FrameType;

std::filesystem::path g_root;

void Write(const std::string& target, const std::string& name,
           const std::string& bytes) {
  std::filesystem::path dir = g_root / target;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / ("seed-" + name), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

template <typename M>
std::string Bytes(const M& message) {
  return message.SerializeAsString();
}

uint64_t Id(uint64_t client, uint64_t n) { return ClientMadeId(client, n); }

ArgSpec Arg(Shape shape, Sharding sharding = Sharding::Replicated(),
            DType dtype = DType::kF32) {
  return ArgSpec{TensorSpec{dtype, std::move(shape)}, sharding};
}

proto::ClientOp SliceOp(uint64_t request, int n,
                        proto::Placement placement = proto::PLACEMENT_ANY,
                        std::vector<int32_t> mesh = {},
                        std::vector<std::string> axes = {}) {
  proto::ClientOp op;
  auto* r = op.mutable_slice_request();
  r->set_request_id(request);
  r->set_num_devices(n);
  r->set_placement(placement);
  for (int32_t m : mesh) r->add_mesh_shape(m);
  for (const auto& a : axes) r->add_axis_names(a);
  return op;
}

proto::ClientOp ProgramOp(uint64_t id, const std::string& kernel,
                          const std::vector<ArgSpec>& inputs,
                          const std::vector<ArgSpec>& outputs) {
  proto::ClientOp op;
  auto* reg = op.mutable_program();
  reg->set_program_id(id);
  reg->mutable_program()->set_name(kernel);
  reg->mutable_program()->set_kernel(kernel);
  for (const ArgSpec& a : inputs)
    *reg->mutable_program()->add_inputs() = ToProto(a);
  for (const ArgSpec& a : outputs) {
    *reg->mutable_program()->add_outputs() = ToProto(a);
  }
  if (kernel == "fill") {
    (*reg->mutable_program()->mutable_attrs())["value"].set_f(1.5);
  }
  return op;
}

proto::ClientOp PutOp(uint64_t buffer, uint64_t slice, const ArgSpec& arg) {
  proto::ClientOp op;
  op.mutable_put()->set_buffer_id(buffer);
  op.mutable_put()->set_slice_id(slice);
  *op.mutable_put()->mutable_arg() = ToProto(arg);
  return op;
}

proto::ClientOp CallOp(uint64_t call_id, uint64_t slice, uint64_t program,
                       const std::vector<std::pair<uint64_t, uint64_t>>& inputs,
                       const ArgSpec& arg, std::vector<uint64_t> outputs) {
  proto::ClientOp op;
  auto* c = op.mutable_call();
  c->set_call_id(call_id);
  c->set_slice_id(slice);
  c->set_program_id(program);
  for (const auto& [buffer, from_slice] : inputs) {
    auto* in = c->add_inputs();
    in->set_buffer_id(buffer);
    in->set_slice_id(from_slice);
    *in->mutable_arg() = ToProto(arg);
  }
  for (uint64_t o : outputs) c->add_output_ids(o);
  return op;
}

proto::ClientOp ReleaseOp(uint64_t buffer, uint64_t slice) {
  proto::ClientOp op;
  op.mutable_release()->set_buffer_id(buffer);
  op.mutable_release()->set_slice_id(slice);
  return op;
}

proto::ClientToServer Batch(std::vector<proto::ClientOp> ops) {
  proto::ClientToServer msg;
  msg.set_client_name("seed");
  for (auto& op : ops) *msg.add_ops() = std::move(op);
  return msg;
}

// --- client batches (client_batch_fuzz.cc: clients 1 and 2; workers 1 and
// 2 with two devices each, worker 3 with one).

// A data-parallel step: slice, program, put, call, all_reduce, release.
std::vector<proto::ClientToServer> DataParallelStep(uint64_t c) {
  const ArgSpec x = Arg({8, 4}, Sharding::Split(0));
  const ArgSpec partial = Arg({8, 4}, Sharding::Partial());
  return {
      Batch({SliceOp(1, 4)}),
      Batch({ProgramOp(Id(c, 1), "add", {x, x}, {x}),
             ProgramOp(Id(c, 2), "identity", {x}, {partial}),
             ProgramOp(Id(c, 3), "all_reduce", {partial}, {Arg({8, 4})}),
             PutOp(Id(c, 10), 1, x),
             CallOp(1, 1, Id(c, 1), {{Id(c, 10), 1}, {Id(c, 10), 1}}, x,
                    {Id(c, 11)}),
             CallOp(2, 1, Id(c, 2), {{Id(c, 11), 1}}, x, {Id(c, 12)}),
             CallOp(3, 1, Id(c, 3), {{Id(c, 12), 1}}, partial, {Id(c, 13)}),
             ReleaseOp(Id(c, 10), 1), ReleaseOp(Id(c, 11), 1),
             ReleaseOp(Id(c, 12), 1)}),
  };
}

// A value moved between slices of different layouts (transfers).
std::vector<proto::ClientToServer> Reshard(uint64_t c) {
  const ArgSpec x4 = Arg({12, 2}, Sharding::Split(0));
  return {
      Batch(
          {SliceOp(1, 4), SliceOp(2, 3),
           SliceOp(3, 2, proto::PLACEMENT_ONE_HOST),
           SliceOp(4, 4, proto::PLACEMENT_SPREAD, {2, 2}, {"data", "model"})}),
      Batch({ProgramOp(Id(c, 1), "relu", {x4}, {x4}), PutOp(Id(c, 10), 1, x4),
             CallOp(1, 2, Id(c, 1), {{Id(c, 10), 1}}, x4, {Id(c, 11)}),
             CallOp(2, 3, Id(c, 1), {{Id(c, 11), 2}}, x4, {Id(c, 12)}),
             ReleaseOp(Id(c, 10), 0), ReleaseOp(Id(c, 11), 2)}),
      Batch({[] {
        proto::ClientOp op;
        op.set_slice_release(2);
        return op;
      }()}),
  };
}

// A slice resized while it holds values (ClusterState::ResizeSlice): a
// shrink, a growth, a mesh axis, and sizes that are refused; then
// suspended and resumed (SuspendSlice, ResumeSlice), a call and a put
// refused while suspended, a second suspend and a stray resume.
std::vector<proto::ClientToServer> Resize(uint64_t c) {
  const ArgSpec x = Arg({8, 2}, Sharding::Split(0));
  auto resize = [](uint64_t request, uint64_t slice, int n, int axis) {
    proto::ClientOp op;
    op.mutable_slice_resize()->set_request_id(request);
    op.mutable_slice_resize()->set_slice_id(slice);
    op.mutable_slice_resize()->set_num_devices(n);
    op.mutable_slice_resize()->set_axis(axis);
    return op;
  };
  auto suspend = [](uint64_t request, uint64_t slice, bool suspend) {
    proto::ClientOp op;
    op.mutable_slice_resize()->set_request_id(request);
    op.mutable_slice_resize()->set_slice_id(slice);
    op.mutable_slice_resize()->set_suspend(suspend);
    op.mutable_slice_resize()->set_resume(!suspend);
    return op;
  };
  return {Batch({SliceOp(1, 4, proto::PLACEMENT_SPREAD),
                 SliceOp(2, 4, proto::PLACEMENT_SPREAD, {2, 2},
                         {"data", "model"})}),
          Batch({ProgramOp(Id(c, 1), "relu", {x}, {x}), PutOp(Id(c, 10), 1, x),
                 CallOp(1, 1, Id(c, 1), {{Id(c, 10), 1}}, x, {Id(c, 11)}),
                 resize(3, 1, 2, 0),
                 CallOp(2, 1, Id(c, 1), {{Id(c, 11), 1}}, x, {Id(c, 12)}),
                 resize(4, 1, 4, 0), resize(5, 2, 2, 1), resize(6, 1, 3, 0),
                 resize(7, 1, 1 << 30, 0), resize(8, 2, 2, 5)}),
          Batch({suspend(9, 1, true), suspend(10, 1, true),
                 CallOp(3, 1, Id(c, 1), {{Id(c, 12), 1}}, x, {Id(c, 13)}),
                 PutOp(Id(c, 14), 1, x), suspend(11, 1, false),
                 suspend(12, 2, false),
                 CallOp(4, 1, Id(c, 1), {{Id(c, 12), 1}}, x, {Id(c, 15)})})};
}

// Errors: unknown program, wrong arity, unknown slice, bad shapes.
std::vector<proto::ClientToServer> Mistakes(uint64_t c) {
  const ArgSpec x = Arg({4}, Sharding::Split(0));
  return {Batch({SliceOp(1, 2), SliceOp(2, 0), SliceOp(3, 9),
                 SliceOp(4, 2, proto::PLACEMENT_ANY, {3})}),
          Batch({ProgramOp(Id(c, 1), "no_such_kernel", {x}, {x}),
                 ProgramOp(Id(c, 2), "matmul", {Arg({4, 4}), Arg({4, 4})},
                           {Arg({4, 4})}),
                 CallOp(1, 1, Id(c, 7), {{Id(c, 10), 1}}, x, {Id(c, 11)}),
                 CallOp(2, 1, Id(c, 2), {{Id(c, 10), 1}}, x, {Id(c, 11)}),
                 CallOp(3, 5, Id(c, 2), {}, x, {Id(c + 1, 11)}),
                 PutOp(Id(c, 12), 1, Arg({3}, Sharding::Split(0))),
                 PutOp(Id(c, 13), 1, Arg({4}, Sharding::Partial()))})};
}

std::string ClientInput(const std::vector<proto::ClientToServer>& batches,
                        uint8_t client_tag) {
  InputWriter w;
  for (const auto& b : batches) w.U8(client_tag).Record(Bytes(b));
  return w.str();
}

void ClientBatchSeeds() {
  const std::string t = "client_batch_fuzz";
  Write(t, "data-parallel", ClientInput(DataParallelStep(1), 0));
  Write(t, "reshard", ClientInput(Reshard(1), 0));
  Write(t, "mistakes", ClientInput(Mistakes(1), 0));
  Write(t, "resize", ClientInput(Resize(1), 0));
  // Inputs of bugs fixed in ClusterState (cluster_state_test.cc): an empty
  // array split over slices of two layouts; meshes of non-positive or huge
  // dimensions.
  const ArgSpec empty = Arg({0, 3}, Sharding::Split(0));
  Write(
      t, "empty-split-reshard",
      ClientInput(
          {Batch({SliceOp(1, 4), SliceOp(2, 2),
                  ProgramOp(Id(1, 1), "relu", {empty}, {empty}),
                  CallOp(1, 2, Id(1, 1), {{Id(1, 2), 1}}, empty, {Id(1, 3)})})},
          0));
  // A PartitionSpec over a 2x2 mesh read by a program compiled for a 1-D
  // split on another slice: routed as N-D boxes of the blocks.
  const ArgSpec mesh =
      Arg({4, 4}, Sharding::Mesh({2, 2}, {"data", "model"}, {{0}, {1}}));
  const ArgSpec cols = Arg({4, 4}, Sharding::Split(1));
  Write(t, "mesh-reshard",
        ClientInput(
            {Batch(
                {SliceOp(1, 4, proto::PLACEMENT_SPREAD, {2, 2},
                         {"data", "model"}),
                 SliceOp(2, 4), ProgramOp(Id(1, 1), "identity", {cols}, {cols}),
                 PutOp(Id(1, 10), 1, mesh),
                 CallOp(1, 2, Id(1, 1), {{Id(1, 10), 1}}, mesh, {Id(1, 11)})})},
            0));
  Write(t, "bad-meshes",
        ClientInput({Batch({SliceOp(1, 2, proto::PLACEMENT_ANY, {-1, -2}),
                            SliceOp(2, 2, proto::PLACEMENT_ANY, {2, 0}),
                            SliceOp(3, 2, proto::PLACEMENT_ANY,
                                    std::vector<int32_t>(4, 2147483647))})},
                    0));
  // Two clients, a worker lost mid-way, a client replaced.
  InputWriter w;
  w.Bytes(ClientInput(DataParallelStep(1), 0));
  w.Bytes(ClientInput(Reshard(2), 1));
  w.U8(2).Record(std::string(1, '\1'));
  w.Bytes(ClientInput(DataParallelStep(1), 0));
  w.U8(3).Record(std::string(1, '\0'));
  w.Bytes(ClientInput(DataParallelStep(3), 0));
  Write(t, "two-clients", w.str());
}

// --- worker batches (worker_batch_fuzz.cc).

void WorkerBatchSeeds() {
  const std::string t = "worker_batch_fuzz";
  auto reg = [](const std::string& name, int devices) {
    proto::WorkerToServer m;
    *m.mutable_register_() = FakeHost(name, devices);
    m.mutable_register_()->set_pid(4242);
    m.mutable_register_()->set_unix_path("plexus-worker-4242");
    return Bytes(m);
  };
  proto::WorkerToServer beat;
  auto* s = beat.mutable_heartbeat();
  s->set_live_buffers(3);
  s->set_live_bytes(4096);
  s->add_device_live_bytes(4096);
  s->add_device_live_bytes(0);
  s->add_device_peak_bytes(8192);
  s->add_device_busy_micros(17);
  s->set_xla_platform("cpu");
  InputWriter one;
  one.U8(0).Record(reg("host0", 2)).U8(1).Record(Bytes(beat));
  Write(t, "one-worker", one.str());
  InputWriter three;
  three.U8(0).Record(reg("host0", 2)).U8(0).Record(reg("host1", 4));
  three.U8(0).Record(reg("host2", 1)).U8(1).Record(Bytes(beat));
  three.U8(4).Record(Bytes(beat)).U8(2).Record("");
  three.U8(1).Record(reg("again", 3));  // a second registration: ignored
  Write(t, "three-workers", three.str());
  proto::WorkerToServer failed;
  auto* f = failed.mutable_transfer_failed();
  f->set_dst_worker_id(2);
  f->set_buffer_id(Id(kServerClientId, 7));
  f->mutable_status()->set_code(14);
  f->mutable_status()->set_message("seed: push to worker 2 failed");
  InputWriter relay;
  relay.U8(0).Record(reg("host0", 2)).U8(0).Record(reg("host1", 2));
  relay.U8(1).Record(Bytes(failed));
  Write(t, "transfer-failed", relay.str());
  InputWriter refused;
  refused.U8(0).Record(Bytes(beat)).U8(0).Record(reg("empty", 0));
  Write(t, "refused", refused.str());
}

// --- worker op streams (worker_ops_fuzz.cc), as the server routes them.

// The ops ClusterState routes for `batches` of client 1, to worker 1 (of
// two workers with two devices each), one ServerToWorker per batch as the
// scheduler would send them; the first names the worker and its peers.
std::vector<proto::ServerToWorker> RoutedOps(
    const std::vector<proto::ClientToServer>& batches) {
  ClusterState state;
  state.AddWorker(FakeHost("host0", 2), absl::UnixEpoch());
  state.AddWorker(FakeHost("host1", 2), absl::UnixEpoch());
  const uint64_t client = state.AddClient("seed").id;
  std::vector<proto::ServerToWorker> out;
  proto::ServerToWorker first;
  first.set_worker_id(1);
  for (int64_t w : {1, 2}) {
    auto* p = first.add_ops()->mutable_peer();
    p->set_worker_id(w);
    p->set_machine_id("fuzz-machine");
    p->set_data_address("127.0.0.1:1");
  }
  out.push_back(first);
  for (const auto& batch : batches) {
    BatchResult r = ApplyClientBatch(state, client, batch);
    proto::ServerToWorker msg;
    msg.set_worker_id(1);
    for (WorkerOps& unit : r.units) {
      for (auto& op : unit[1]) *msg.add_ops() = std::move(op);
    }
    if (msg.ops_size() > 0) out.push_back(std::move(msg));
  }
  return out;
}

std::string OpsInput(const std::vector<proto::ServerToWorker>& messages) {
  InputWriter w;
  for (const auto& m : messages) w.Record(Bytes(m));
  return w.str();
}

void WorkerOpsSeeds() {
  const std::string t = "worker_ops_fuzz";
  Write(t, "data-parallel", OpsInput(RoutedOps(DataParallelStep(1))));
  Write(t, "reshard", OpsInput(RoutedOps(Reshard(1))));
  // Computed values only (fill, then add and a reshard of them): the
  // devices run these to the end without any data from the data plane.
  const ArgSpec x = Arg({4, 2}, Sharding::Split(0));
  const ArgSpec r = Arg({4, 2});
  std::vector<proto::ServerToWorker> computed = RoutedOps({
      Batch({SliceOp(1, 2, proto::PLACEMENT_ONE_HOST), SliceOp(2, 1)}),
      Batch({ProgramOp(Id(1, 1), "fill", {}, {x}),
             ProgramOp(Id(1, 2), "add", {x, x}, {x}),
             ProgramOp(Id(1, 3), "identity", {r}, {r}),
             CallOp(1, 1, Id(1, 1), {}, x, {Id(1, 10)}),
             CallOp(2, 1, Id(1, 2), {{Id(1, 10), 1}, {Id(1, 10), 1}}, x,
                    {Id(1, 11)}),
             CallOp(3, 2, Id(1, 3), {{Id(1, 11), 1}}, r, {Id(1, 12)}),
             ReleaseOp(Id(1, 10), 1), ReleaseOp(Id(1, 11), 1),
             ReleaseOp(Id(1, 12), 2)}),
  });
  Write(t, "computed", OpsInput(computed));
  // Failures, a peer lost, the client gone.
  proto::ServerToWorker ends;
  auto* fail = ends.add_ops()->mutable_fail();
  fail->add_buffer_ids(Id(1, 11));
  fail->mutable_status()->set_code(3);
  fail->mutable_status()->set_message("seed: call rejected");
  auto* down = ends.add_ops()->mutable_peer_down();
  down->set_worker_id(2);
  down->mutable_status()->set_code(14);
  down->mutable_status()->set_message("seed: worker 2 lost");
  ends.add_ops()->mutable_client_gone()->set_client_id(1);
  computed.push_back(ends);
  Write(t, "computed-then-gone", OpsInput(computed));
}

// --- data-plane frames (data_plane_fuzz.cc).

std::string Frame(FrameType type, uint64_t buffer, int32_t shard,
                  const std::string& payload = "", uint64_t claimed = ~0ull) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.buffer_id = buffer;
  h.shard = shard;
  h.payload_bytes = claimed != ~0ull ? claimed : payload.size();
  if (type == FrameType::kPushError || type == FrameType::kError) {
    h.status_code = static_cast<int32_t>(absl::StatusCode::kAborted);
  }
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  return out + payload;
}

proto::WorkerOp DeclareOp(uint64_t buffer, int32_t shard, int device,
                          const TensorSpec& spec) {
  proto::WorkerOp op;
  auto* d = op.mutable_declare();
  d->set_buffer_id(buffer);
  d->set_shard(shard);
  d->set_device(device);
  *d->mutable_spec() = ToProto(spec);
  return op;
}

proto::WorkerOp ExpectOp(uint64_t buffer, int64_t from, int device,
                         const TensorSpec& spec) {
  proto::WorkerOp op;
  auto* e = op.mutable_expect();
  e->set_buffer_id(buffer);
  e->set_src_worker_id(from);
  e->set_device(device);
  *e->mutable_spec() = ToProto(spec);
  return op;
}

enum Carrier : uint8_t { kTcp = 0, kUnix = 1 };

std::string DataPlaneInput(uint8_t flags, const proto::ServerToWorker& ops,
                           const std::string& bytes, uint32_t memfd_bytes = 0) {
  InputWriter w;
  w.U8(flags);
  if (flags & 2) w.U32(memfd_bytes);
  w.Record(ops.ops_size() > 0 ? Bytes(ops) : "");
  w.Bytes(bytes);
  return w.str();
}

void DataPlaneSeeds() {
  const std::string t = "data_plane_fuzz";
  const TensorSpec f4{DType::kF32, {4}};
  const std::string sixteen(16, '\x3f');
  const uint64_t x = Id(1, 10), y = Id(1, 11), temp = Id(kServerClientId, 1);
  proto::ServerToWorker declared;
  declared.set_worker_id(1);
  *declared.add_ops() = DeclareOp(x, 0, 0, f4);
  *declared.add_ops() = ExpectOp(temp, 2, 1, f4);

  const std::string put_fetch = Frame(FrameType::kPut, x, 0, sixteen) +
                                Frame(FrameType::kWait, x, 0) +
                                Frame(FrameType::kFetch, x, 0);
  for (uint8_t carrier : {kTcp, kUnix}) {
    const std::string c = carrier == kUnix ? "unix-" : "tcp-";
    Write(t, c + "put-fetch", DataPlaneInput(carrier, declared, put_fetch));
    // Flag 16: the connection is a worker's (a push is allowed, the fetch
    // that follows is not).
    Write(t, c + "push-fetch",
          DataPlaneInput(carrier | 16, declared,
                         Frame(FrameType::kPush, temp, 0, sixteen) +
                             Frame(FrameType::kFetch, temp, 0)));
  }
  // Flag 8: no handshake; the first frame is a PUT: refused.
  Write(t, "no-handshake", DataPlaneInput(kUnix | 8, declared, put_fetch));
  Write(t, "put-undeclared",
        DataPlaneInput(kUnix, {}, Frame(FrameType::kPut, y, 0, sixteen)));
  Write(t, "put-wrong-size",
        DataPlaneInput(kUnix, declared,
                       Frame(FrameType::kPut, x, 0, std::string(12, 'a')) +
                           Frame(FrameType::kFetch, x, 0)));
  Write(t, "put-claims-more",
        DataPlaneInput(kTcp, declared,
                       Frame(FrameType::kPut, x, 0, sixteen, 1 << 30)));
  Write(
      t, "push-error",
      DataPlaneInput(kUnix, declared,
                     Frame(FrameType::kPushError, temp, 0, "upstream failed") +
                         Frame(FrameType::kWait, temp, 0)));
  Write(t, "fetch-unknown",
        DataPlaneInput(kUnix, {}, Frame(FrameType::kFetch, y, 3)));
  Write(t, "reply-frames-from-client",
        DataPlaneInput(kTcp, {},
                       Frame(FrameType::kAck, x, 0) +
                           Frame(FrameType::kError, x, 0, "no")));
  std::string bad = Frame(FrameType::kPut, x, 0, sixteen);
  bad[0] ^= 1;  // magic
  Write(t, "bad-magic", DataPlaneInput(kUnix, declared, bad));
  Write(t, "truncated",
        DataPlaneInput(kTcp, declared,
                       Frame(FrameType::kPut, x, 0, sixteen).substr(0, 40)));
  // A PUT whose bytes ride in a memfd (flag 2, sealed: flag 4).
  FrameHeader fd_put;
  fd_put.type = static_cast<uint16_t>(FrameType::kPut);
  fd_put.flags = transport::internal::kFlagFd;
  fd_put.buffer_id = x;
  fd_put.payload_bytes = 16;
  const std::string fd_frame(reinterpret_cast<const char*>(&fd_put),
                             sizeof(fd_put));
  Write(t, "memfd-put",
        DataPlaneInput(kUnix | 2 | 4, declared,
                       fd_frame + Frame(FrameType::kFetch, x, 0), 16));
  Write(t, "memfd-unsealed", DataPlaneInput(kUnix | 2, declared, fd_frame, 16));
  // PUSH_IPC (a shard by CUDA IPC) from a worker, a client, over TCP, and
  // with a payload that breaks its rules: a worker without CUDA answers
  // ERROR (send the bytes), the push that follows is stored.
  transport::IpcShard ipc;
  ipc.bytes = 16;
  ipc.handle.fill('\x5a');
  const auto ipc_payload = [](const transport::IpcShard& shard) {
    const transport::internal::IpcPayload p =
        transport::internal::EncodeIpc(shard);
    return std::string(reinterpret_cast<const char*>(&p), sizeof(p));
  };
  const std::string push_ipc =
      Frame(FrameType::kPushIpc, temp, 0, ipc_payload(ipc));
  for (uint8_t carrier : {kTcp, kUnix}) {
    const std::string c = carrier == kUnix ? "unix-" : "tcp-";
    Write(t, c + "push-ipc-then-push",
          DataPlaneInput(carrier | 16, declared,
                         push_ipc + Frame(FrameType::kPush, temp, 0, sixteen)));
  }
  Write(t, "push-ipc-from-client", DataPlaneInput(kUnix, declared, push_ipc));
  transport::IpcShard huge = ipc;
  huge.bytes = ~0ull;
  huge.ordinal = -1;
  Write(t, "push-ipc-bad-payload",
        DataPlaneInput(kUnix | 16, declared,
                       Frame(FrameType::kPushIpc, temp, 0, ipc_payload(huge)) +
                           Frame(FrameType::kPushIpc, temp, 0, "short")));
  // A call waiting on a put: the ops load a program and run it on the put
  // value once its bytes arrive; the client fetches the result.
  std::vector<proto::ServerToWorker> routed = RoutedOps({
      Batch({SliceOp(1, 1)}),
      Batch({ProgramOp(Id(1, 1), "identity", {Arg({4})}, {Arg({4})}),
             PutOp(x, 1, Arg({4})),
             CallOp(1, 1, Id(1, 1), {{x, 1}}, Arg({4}), {y})}),
  });
  proto::ServerToWorker call_ops;
  call_ops.set_worker_id(1);
  for (const auto& m : routed) {
    for (const auto& op : m.ops()) *call_ops.add_ops() = op;
  }
  Write(t, "put-then-call",
        DataPlaneInput(kUnix, call_ops,
                       Frame(FrameType::kPut, x, 0, sixteen) +
                           Frame(FrameType::kFetch, y, 0)));
}

// --- compile options (compile_options_fuzz.cc).

using xla::testing::LenField;
using xla::testing::Varint;
using xla::testing::VarintField;

// CompileOptionsProto { executable_build_options { num_replicas,
// num_partitions, device_assignment } }, as jaxlib writes it.
std::string Options(int replicas, int partitions,
                    const std::vector<int>* assigned, bool packed = true) {
  std::string build = VarintField(4, replicas) + VarintField(5, partitions);
  if (assigned != nullptr) {
    std::string computations;
    for (int d : *assigned) {
      std::string ids = packed ? LenField(1, Varint(d)) : VarintField(1, d);
      computations += LenField(3, ids);
    }
    build += LenField(
        9, VarintField(1, 1) + VarintField(2, assigned->size()) + computations);
  }
  return VarintField(1, 0) + LenField(3, build);
}

std::string OptionsInput(const std::vector<int>& devices,
                         const std::string& options) {
  InputWriter w;
  w.U8(static_cast<uint8_t>(devices.size()));
  for (int d : devices) w.U8(static_cast<uint8_t>(d));
  return w.Bytes(options).str();
}

void CompileOptionsSeeds() {
  const std::string t = "compile_options_fuzz";
  const std::vector<int> one = {0}, two = {0, 1}, other = {2, 3};
  Write(t, "one-device", OptionsInput(one, Options(1, 1, nullptr)));
  Write(t, "two-devices", OptionsInput(two, Options(1, 2, &two)));
  Write(t, "other-devices", OptionsInput(other, Options(1, 2, &other, false)));
  Write(t, "zero-replicas", OptionsInput(two, Options(0, 2, &two)));
  Write(t, "wrong-assignment", OptionsInput(other, Options(1, 2, &two)));
  Write(t, "not-a-proto", OptionsInput(one, "\xff\xff\xff"));
  // Islands XLA cannot run on, whose matching options once passed.
  const std::vector<int> none = {}, twice = {1, 1};
  Write(t, "no-devices", OptionsInput(none, Options(1, 0, &none)));
  Write(t, "device-twice", OptionsInput(twice, Options(1, 2, &twice)));
}

// --- the journal's reader (journal_reader_fuzz.cc).

// flags, the first key, then (skip, record) per stored value.
std::string JournalInput(
    uint8_t flags, uint64_t first_key,
    const std::vector<std::pair<uint8_t, std::string>>& entries) {
  InputWriter w;
  w.U8(flags).U64(first_key);
  for (const auto& [skip, value] : entries) w.U8(skip).Record(value);
  return w.str();
}

void JournalReaderSeeds() {
  using journal::internal::EncodeRecord;
  const std::string t = "journal_reader_fuzz";
  const std::string r1 = EncodeRecord(1, 1, "session 7 opened");
  const std::string r2 = EncodeRecord(2, 2, "slice 3 on hosts 0,1");
  const std::string r3 = EncodeRecord(3, 4, "call 12 held");
  Write(t, "empty", JournalInput(0, 1, {}));
  Write(t, "three-records", JournalInput(0, 1, {{0, r1}, {0, r2}, {0, r3}}));
  Write(t, "snapshot-first",
        JournalInput(0, 6,
                     {{0, EncodeRecord(6, journal::kSnapshotType, "state")},
                      {0, EncodeRecord(7, 1, "a")},
                      {0, EncodeRecord(8, 1, "b")}}));
  std::string flipped = r2;
  flipped.back() ^= 0x10;
  Write(t, "checksum-mismatch",
        JournalInput(0, 1, {{0, r1}, {0, flipped}, {0, r3}}));
  Write(t, "torn-tail",
        JournalInput(0, 1, {{0, r1}, {0, r2}, {0, r3.substr(0, 21)}}));
  Write(t, "gap", JournalInput(0, 1, {{0, r1}, {1, r3}}));
  // Flag 1: the harness fixes each CRC, so these reach the later checks.
  Write(t, "misplaced", JournalInput(1, 1, {{0, r1}, {0, r3}}));
  Write(t, "snapshot-later",
        JournalInput(
            1, 1,
            {{0, r1}, {0, EncodeRecord(2, journal::kSnapshotType, "late")}}));
  Write(t, "starts-late", JournalInput(1, 2, {{0, r2}, {0, r3}}));
}

}  // namespace
}  // namespace plexus::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir, e.g. fuzz/corpus>\n", argv[0]);
    return 2;
  }
  plexus::fuzz::g_root = argv[1];
  plexus::fuzz::ClientBatchSeeds();
  plexus::fuzz::WorkerBatchSeeds();
  plexus::fuzz::WorkerOpsSeeds();
  plexus::fuzz::DataPlaneSeeds();
  plexus::fuzz::CompileOptionsSeeds();
  plexus::fuzz::JournalReaderSeeds();
  return 0;
}
