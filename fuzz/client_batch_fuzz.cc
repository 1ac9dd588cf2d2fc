// Fuzz target: client batches (proto::ClientToServer, as a client's stream
// delivers them) applied to the server's ClusterState the way the server
// applies them (cluster_harness.h): slices, program registrations, calls,
// puts and releases routed into worker ops for three registered workers
// (2, 2 and 1 devices).
//
// Input: records of u8 tag + u16 length + payload. Tag mod 4: 0 and 1, a
// batch from client 1 or 2 (bytes that do not parse are skipped, as gRPC
// would refuse them); 2, worker 1 + payload[0] mod 3 goes down; 3, client
// 1 + (payload[0] & 1) disconnects and another connects in its place.
// Every routed op must address known workers and devices, input pieces must
// fit their inputs, and the placement counters must match the live slices
// (cluster_harness.h); after every client leaves, no slice or load is left.
#include "fuzz/cluster_harness.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/stubs/logging.h"

namespace plexus::fuzz {
namespace {

uint8_t First(const std::string& s) {
  return s.empty() ? 0 : static_cast<uint8_t>(s[0]);
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
  state.AddWorker(FakeHost("host0", 2), absl::UnixEpoch());
  state.AddWorker(FakeHost("host1", 2), absl::UnixEpoch());
  state.AddWorker(FakeHost("host2", 1), absl::UnixEpoch());
  uint64_t clients[2] = {state.AddClient("a").id, state.AddClient("b").id};

  InputReader in(data, size);
  for (int records = 0; !in.empty() && records < 64; ++records) {
    const uint8_t tag = in.U8();
    const std::string payload = in.Record();
    switch (tag % 4) {
      case 0:
      case 1: {
        proto::ClientToServer msg;
        if (!msg.ParseFromString(payload)) break;
        BatchResult r = ApplyClientBatch(state, clients[tag % 4], msg);
        for (const WorkerOps& unit : r.units) CheckOps(state, unit);
        r.reply.ByteSizeLong();
        break;
      }
      case 2:
        state.MarkWorkerDown(1 + First(payload) % 3, "fuzz: worker down");
        // Waiting slice requests: those that fit now, or all of them past
        // their deadline.
        state.ServePendingSlices(First(payload) & 0x80 ? absl::InfiniteFuture()
                                                       : absl::UnixEpoch());
        break;
      case 3: {
        const int c = First(payload) & 1;
        state.RemoveClient(clients[c]);
        clients[c] = state.AddClient("again").id;
        break;
      }
    }
    CheckPlacement(state);
  }
  DescribeEverything(state);
  for (uint64_t c : clients) state.RemoveClient(c);
  CheckPlacement(state);
  if (!state.slices().empty()) Broken("slices outlive their clients");
  if (!state.pending_slices().empty()) {
    Broken("slice requests outlive their clients");
  }
  return 0;
}
