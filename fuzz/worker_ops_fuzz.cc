// Fuzz target: the op stream a worker reads from the server
// (proto::ServerToWorker), applied by a real WorkerImpl (object store, two
// CPU devices, data plane; no server: worker_harness.h) as its reader
// thread applies it: program loads, executes (run on the devices), puts'
// declarations, transfers' expectations, transfers, releases, failures,
// peers, peers down, clients gone. Then the worker is torn down, as at
// shutdown.
//
// Input: records of u16 length + one serialized ServerToWorker (bytes that
// do not parse are skipped). Peer addresses are replaced by a refused port
// (worker_harness.h).
#include "fuzz/fuzz_support.h"
#include "fuzz/worker_harness.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 notes
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace plexus;
  std::unique_ptr<WorkerImpl> worker = fuzz::StartWorker();
  fuzz::InputReader in(data, size);
  for (int records = 0; !in.empty() && records < 32; ++records) {
    proto::ServerToWorker msg;
    if (!msg.ParseFromString(in.Record())) continue;
    fuzz::DisarmPeers(msg);
    worker->ApplyOps(msg);
  }
  fuzz::WaitForDevices(*worker, absl::Milliseconds(20));
  worker.reset();
  return 0;
}
