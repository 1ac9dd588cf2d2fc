// plexus-bench-model: the controller's own work per call over H hosts, on
// the model alone (ClusterState and Admission; no gRPC, no threads, no
// other process), so that what is O(H) in our code is measured apart from
// the kernel and the machine's other load (issue 28, item 1).
//
// One iteration is one chained call of a one-input, one-output program
// over a slice of H devices, one per host, as a client's loop makes it:
// the call is routed (its Executes encoded once for all hosts), enqueued
// and admitted (its ticket), every host reports it done in a CallsDone of
// its own, its record ends (ClusterState::CallDone), and the client's
// release of the previous value is routed (held while the call reads it,
// then let go to every host, as the server does: gathered by slice and
// encoded once for its hosts; PLEXUS_BENCH_RELEASE_OPS=1 makes them an op
// per host instead). It reports ns per call and per host per call
// (counter "ns_per_host").
//
//   build/bin/plexus-bench-model [--benchmark_filter=...]
//       [--benchmark_repetitions=N]
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "plexus/common/ids.h"
#include "plexus/common/types.h"
#include "plexus/server/model/cluster_state.h"
#include "plexus/server/scheduling/admission.h"

namespace plexus {
namespace {

proto::RegisterWorker Host(int i) {
  proto::RegisterWorker r;
  r.set_host_name("host" + std::to_string(i));
  auto* dev = r.add_devices();
  dev->set_index(0);
  dev->set_memory_bytes(int64_t{1} << 30);
  return r;
}

// A cluster of `hosts` hosts, one client with a slice over all of them, a
// split value on it and a program that maps it to a value like it.
class ChainedCalls {
 public:
  explicit ChainedCalls(int hosts) : hosts_(hosts) {
    for (int i = 0; i < hosts; ++i) {
      const int64_t id = state_.AddWorker(Host(i), absl::Now()).id;
      admission_.AddWorker(id, 1);
    }
    client_ = state_.AddClient("bench").id;
    admission_.AddClient(client_, 1.0, 1 << 20);
    proto::SliceRequest req;
    req.set_num_devices(hosts);
    req.set_placement(proto::PLACEMENT_SPREAD);
    auto slice = state_.CreateSlice(client_, req);
    if (!slice.ok()) Fail(slice.status());
    slice_ = slice->slice_id();
    spec_ = ArgSpec{TensorSpec{DType::kF32, {hosts}}, Sharding::Split(0)};
    proto::RegisterProgram reg;
    reg.set_program_id(Id(1));
    reg.mutable_program()->set_name("scale");
    reg.mutable_program()->set_kernel("scale");
    *reg.mutable_program()->add_inputs() = ToProto(spec_);
    *reg.mutable_program()->add_outputs() = ToProto(spec_);
    if (absl::Status s = state_.RegisterProgram(client_, reg); !s.ok()) {
      Fail(s);
    }
    proto::PutDecl put;
    put.set_buffer_id(value_ = Id(next_++));
    put.set_slice_id(slice_);
    *put.mutable_arg() = ToProto(spec_);
    WorkerOps ops;
    if (absl::Status s = state_.RoutePut(client_, put, &ops); !s.ok()) Fail(s);
  }

  // One chained call, from its routing to the release of its input.
  void Step() {
    const uint64_t out = Id(next_++);
    proto::Call call;
    call.set_call_id(out);
    call.set_slice_id(slice_);
    call.set_program_id(Id(1));
    proto::InputRef* in = call.add_inputs();
    in->set_buffer_id(value_);
    in->set_slice_id(slice_);
    *in->mutable_arg() = ToProto(spec_);
    call.add_output_ids(out);
    WorkerOps ops;
    uint64_t seq = 0;
    std::shared_ptr<CallExecutes> executes;
    if (absl::Status s = state_.RouteCall(client_, call, &ops, &seq, &executes);
        !s.ok()) {
      Fail(s);
    }
    // The client drops its future of the input: held while the call
    // reads it.
    proto::ReleaseRef release;
    release.set_buffer_id(value_);
    release.set_slice_id(slice_);
    state_.RouteRelease(client_, release, &ops);
    value_ = out;
    admission_.Enqueue(
        client_, MakeAdmissionUnit(std::move(ops), seq, std::move(executes)));
    uint64_t client = 0;
    AdmissionUnit unit;
    if (!admission_.Next(&client, &unit)) Fail(absl::InternalError("no room"));
    sent_ops_ += static_cast<int64_t>(unit.ops.size());
    // Every host reports it done, each in a report of its own.
    const uint64_t ticket = unit.executes->ticket();
    for (int h = 0; h < unit.executes->hosts(); ++h) {
      done_.Clear();
      done_.add_client_ids(client_);
      done_.add_tickets(ticket);
      done_.add_busy_micros(10);
      admission_.Completed(unit.executes->worker(h), done_);
    }
    admission_.TakeDoneCalls(&done_calls_);
    // As the server applies completions: the releases of a wide slice
    // gathered by slice (its ids, for all its hosts), with
    // PLEXUS_BENCH_RELEASE_OPS set as an op per host instead.
    WorkerOps releases;
    SharedReleases shared;
    for (const auto& [done_seq, failed] : done_calls_) {
      state_.CallDone(done_seq, failed, &releases,
                      per_host_releases_ ? nullptr : &shared);
    }
    sent_ops_ += static_cast<int64_t>(releases.size());
    for (const auto& [slice, release] : shared) {
      shared_ids_ += static_cast<int64_t>(release.ids.size());
    }
  }

  int64_t sent_ops() const { return sent_ops_; }
  int64_t shared_ids() const { return shared_ids_; }

 private:
  uint64_t Id(uint64_t n) const { return ClientMadeId(client_, n); }
  [[noreturn]] static void Fail(const absl::Status& s) {
    fprintf(stderr, "plexus-bench-model: %s\n",
            std::string(s.message()).c_str());
    std::abort();
  }

  const int hosts_;
  ClusterState state_;
  Admission admission_;
  uint64_t client_ = 0;
  uint64_t slice_ = 0;
  ArgSpec spec_;
  uint64_t value_ = 0;
  uint64_t next_ = 2;
  int64_t sent_ops_ = 0;
  int64_t shared_ids_ = 0;
  const bool per_host_releases_ = getenv("PLEXUS_BENCH_RELEASE_OPS") != nullptr;
  proto::CallsDone done_;
  std::vector<std::pair<uint64_t, bool>> done_calls_;
};

void BM_ChainedCall(benchmark::State& bench) {
  const int hosts = static_cast<int>(bench.range(0));
  ChainedCalls calls(hosts);
  for (auto _ : bench) calls.Step();
  bench.counters["ns_per_host"] = benchmark::Counter(
      static_cast<double>(bench.iterations()) * hosts,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  // Per call: the workers sent ops outside the call's Executes (its
  // input's release, when made an op per host), and the ids released once
  // for all the hosts of their slice.
  bench.counters["worker_ops_lists"] =
      benchmark::Counter(static_cast<double>(calls.sent_ops()),
                         benchmark::Counter::kAvgIterations);
  bench.counters["shared_release_ids"] =
      benchmark::Counter(static_cast<double>(calls.shared_ids()),
                         benchmark::Counter::kAvgIterations);
}
// Admission's pass over units blocked by full windows: clients with one
// call each over all H hosts, every host's window full (one call in
// flight, min_window_calls 1); each Next tries every client's call and
// admits none. A blocked call stops at its first full host and reserves
// its H hosts (a copy); a later one over the same hosts stops at its
// first, reserved. (Calls over disjoint hosts behind a blocked one would
// scan the reserved list per host: not measured here.)
void BM_AdmissionPastBlockedWideCalls(benchmark::State& bench) {
  const int hosts = static_cast<int>(bench.range(0));
  constexpr int kClients = 4;
  Admission admission({.window_micros = 100,
                       .min_window_calls = 1,
                       .default_cost_micros = 150});
  std::vector<int64_t> workers;
  for (int i = 1; i <= hosts; ++i) {
    admission.AddWorker(i, 1);
    workers.push_back(i);
  }
  auto wide = [&](uint64_t program) {
    AdmissionUnit unit;
    unit.program_id = program;
    unit.exec_workers.assign(workers.begin(), workers.end());
    return unit;
  };
  for (uint64_t c = 1; c <= kClients; ++c) admission.AddClient(c, 1.0, 64);
  admission.Enqueue(1, wide(1));  // fills every window
  uint64_t client = 0;
  AdmissionUnit unit;
  if (!admission.Next(&client, &unit)) std::abort();
  for (uint64_t c = 1; c <= kClients; ++c) admission.Enqueue(c, wide(c));
  for (auto _ : bench) {
    if (admission.Next(&client, &unit)) std::abort();  // all blocked
  }
  bench.counters["ns_per_host_per_client"] = benchmark::Counter(
      static_cast<double>(bench.iterations()) * hosts * kClients,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AdmissionPastBlockedWideCalls)->Arg(32)->Arg(512)->Arg(2048);

BENCHMARK(BM_ChainedCall)
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Arg(128)
    ->Arg(512)
    ->Arg(2048);

}  // namespace
}  // namespace plexus

BENCHMARK_MAIN();
