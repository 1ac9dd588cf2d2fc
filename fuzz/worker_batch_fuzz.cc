// Fuzz target: worker messages (proto::WorkerToServer: a registration, then
// heartbeats) applied to the server's ClusterState as its WorkerSession
// applies them, then acted on: slices placed over the registered devices in
// every placement, a put and a call routed onto each slice, and the status
// every client can read.
//
// Input: records of u8 tag + u16 length + payload. Tag mod 3: 0, a new
// session whose first message is the payload (refused unless it registers);
// 1, the payload on open session tag / 3 (a heartbeat is recorded, a
// failed transfer relayed to its destination; a second registration is
// ignored, as the server does); 2, session tag / 3 ends (the worker
// is down). The routed ops and the placement are checked as in
// client_batch_fuzz.cc.
#include <vector>

#include "fuzz/cluster_harness.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/stubs/logging.h"
#include "plexus/store/object_store.h"

namespace plexus::fuzz {
namespace {

proto::ArgDef Split16() {
  ArgSpec arg;
  arg.global = TensorSpec{DType::kF32, {16}};
  arg.sharding = Sharding::Split(0);
  return ToProto(arg);
}

// A client that uses every placement over whatever registered.
void Probe(ClusterState& state) {
  const uint64_t client = state.AddClient("probe").id;
  auto id = [&](uint64_t n) { return ClientMadeId(client, n); };
  proto::RegisterProgram reg;
  reg.set_program_id(id(1));
  reg.mutable_program()->set_name("add");
  reg.mutable_program()->set_kernel("add");
  *reg.mutable_program()->add_inputs() = Split16();
  *reg.mutable_program()->add_inputs() = Split16();
  *reg.mutable_program()->add_outputs() = Split16();
  if (!state.RegisterProgram(client, reg).ok()) Broken("add does not register");
  uint64_t next = 2;
  for (int n : {1, 2, 4, 8}) {
    for (auto placement : {proto::PLACEMENT_ANY, proto::PLACEMENT_ONE_HOST,
                           proto::PLACEMENT_SPREAD}) {
      proto::SliceRequest req;
      req.set_num_devices(n);
      req.set_placement(placement);
      auto slice = state.CreateSlice(client, req);
      if (!slice.ok()) continue;
      WorkerOps ops;
      proto::PutDecl put;
      put.set_buffer_id(id(next++));
      put.set_slice_id(slice->slice_id());
      *put.mutable_arg() = Split16();
      if (!state.RoutePut(client, put, &ops).ok()) Broken("put not routed");
      proto::Call call;
      call.set_call_id(next);
      call.set_slice_id(slice->slice_id());
      call.set_program_id(id(1));
      for (int i = 0; i < 2; ++i) {
        proto::InputRef* in = call.add_inputs();
        in->set_buffer_id(put.buffer_id());
        in->set_slice_id(slice->slice_id());
        *in->mutable_arg() = Split16();
      }
      call.add_output_ids(id(next++));
      if (!state.RouteCall(client, call, &ops).ok()) Broken("call not routed");
      proto::ReleaseRef release;
      release.set_buffer_id(put.buffer_id());
      release.set_slice_id(slice->slice_id());
      state.RouteRelease(client, release, &ops);
      CheckOps(state, ops);
      CheckPlacement(state);
    }
  }
  DescribeEverything(state);
  state.RemoveClient(client);
  CheckPlacement(state);
  if (!state.slices().empty()) Broken("slices outlive their client");
}

}  // namespace
}  // namespace plexus::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 notes
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace plexus;
  using namespace plexus::fuzz;
  ClusterState state;
  std::vector<int64_t> sessions;  // workers whose sessions are open
  absl::Time now = absl::UnixEpoch();
  InputReader in(data, size);
  for (int records = 0; !in.empty() && records < 64; ++records) {
    const uint8_t tag = in.U8();
    const std::string payload = in.Record();
    now += absl::Milliseconds(1);
    proto::WorkerToServer msg;
    const bool parsed = msg.ParseFromString(payload);
    switch (tag % 3) {
      case 0:
        if (!parsed || !msg.has_register_()) break;
        sessions.push_back(state.AddWorker(msg.register_(), now).id);
        break;
      case 1: {
        if (sessions.empty() || !parsed) break;
        WorkerRecord* w = state.FindWorker(sessions[tag / 3 % sessions.size()]);
        if (w == nullptr) Broken("an open session without its worker");
        if (msg.has_heartbeat()) {
          w->stats = msg.heartbeat();
          w->last_heartbeat = now;
          w->heartbeats++;
        } else if (msg.has_transfer_failed()) {
          WorkerOps relayed =
              RelayTransferFailure(state, msg.transfer_failed());
          CheckOps(state, relayed);
          StatusFromProto(msg.transfer_failed().status()).IgnoreError();
        }
        break;
      }
      case 2: {
        if (sessions.empty()) break;
        const size_t i = tag / 3 % sessions.size();
        state.MarkWorkerDown(sessions[i], "fuzz: session ended");
        sessions.erase(sessions.begin() + static_cast<long>(i));
        break;
      }
    }
  }
  Probe(state);
  return 0;
}
