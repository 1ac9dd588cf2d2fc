// Execution of XLA programs: the tasks of one call on this worker form an
// island that runs the program's SPMD executable once over its devices.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "plexus/common/logging.h"
#include "plexus/executors/xla/compile_options.h"
#include "plexus/worker/call_context.h"
#include "plexus/worker/worker_impl.h"

namespace plexus {

absl::StatusOr<std::shared_ptr<const xla::PjrtExecutable>>
WorkerImpl::XlaExecutableFor(LoadedProgram& program,
                             const std::vector<int>& devices) {
  // Held throughout: the compiler thread and the first call's device
  // thread resolve an island once between them; the later one waits.
  absl::MutexLock lock(&program.xla_mu);
  auto it = program.executables.find(devices);
  if (it != program.executables.end()) return it->second;
  const proto::XlaIsland* island = nullptr;
  for (const auto& candidate : program.xla->islands()) {
    if (std::vector<int>(candidate.devices().begin(),
                         candidate.devices().end()) == devices) {
      island = &candidate;
    }
  }
  if (island == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not compiled for devices [", absl::StrJoin(devices, ", "),
        "] of worker ", worker_id_.load(),
        " (was the slice re-placed after plexus.jit lowered it?)"));
  }
  auto runtime = xla_->Runtime();
  if (!runtime.ok()) return runtime.status();
  const std::string& lowered_for = program.xla->platform();
  if (!lowered_for.empty() && lowered_for != (*runtime)->platform()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lowered for platform '", lowered_for,
        "' but this worker's PJRT plugin runs '", (*runtime)->platform(),
        "' (plexus.jit(..., platform=...))"));
  }
  // Options that would abort XLA, or place the program on other devices,
  // never reach the plugin.
  if (absl::Status s =
          xla::CheckCompileOptions(island->compile_options(), devices);
      !s.ok()) {
    return s;
  }
  const std::string& module =
      island->module().empty() ? program.xla->module() : island->module();
  // Cached here; else, for an island this worker stands by for (a spare:
  // the island names other workers), loaded from a worker that runs it;
  // else compiled. (The island's own workers compile: nobody has it yet
  // when they are loaded with it.)
  absl::StatusOr<std::shared_ptr<const xla::PjrtExecutable>> exe =
      xla_->Lookup(module, island->compile_options());
  const bool names_me =
      std::find(island->workers().begin(), island->workers().end(),
                worker_id_.load()) != island->workers().end();
  if (*exe == nullptr && !names_me) {
    ScopedEvent load(&timeline_, EventKind::kLoad);
    load.event.label = timeline_.Intern(program.name);
    load.event.device = devices.empty() ? -1 : devices.front();
    exe = LoadFromPeers(program, module, *island);
    if (*exe == nullptr) load.event.failed = true;
  }
  if (*exe == nullptr) {
    ScopedEvent compile(&timeline_, EventKind::kCompile);
    compile.event.label = timeline_.Intern(program.name);
    compile.event.device = devices.empty() ? -1 : devices.front();
    const int64_t listed = BeginCompile(program, devices);
    absl::Cleanup unlist = [&] { EndCompile(listed); };
    exe = xla_->GetOrCompile(module, island->compile_options());
    compile.event.failed = !exe.ok();
  }
  if (!exe.ok()) return exe.status();
  if ((*exe)->num_partitions() != static_cast<int>(devices.size())) {
    return absl::InternalError(
        absl::StrCat("compiled for ", (*exe)->num_partitions(),
                     " devices, the island has ", devices.size()));
  }
  if ((*exe)->outputs().size() != program.outputs.size()) {
    return absl::InternalError(absl::StrCat(
        "XLA compiled ", (*exe)->outputs().size(),
        " outputs, the program declared ", program.outputs.size()));
  }
  program.executables[devices] = *exe;
  return *exe;
}

std::shared_ptr<const xla::PjrtExecutable> WorkerImpl::LoadFromPeers(
    const LoadedProgram& program, const std::string& module,
    const proto::XlaIsland& island) {
  const std::vector<int> devices(island.devices().begin(),
                                 island.devices().end());
  const uint64_t fingerprint =
      xla::XlaExecutor::Fingerprint(module, island.compile_options());
  // The workers of every island of the program on the same devices with the
  // same module and options: each has compiled (or loaded) this content.
  std::vector<int64_t> peers;
  for (const auto& other : program.xla->islands()) {
    const std::string& its_module =
        other.module().empty() ? program.xla->module() : other.module();
    if (other.compile_options() != island.compile_options() ||
        its_module != module) {
      continue;
    }
    for (int64_t w : other.workers()) {
      if (w != worker_id_.load() &&
          std::find(peers.begin(), peers.end(), w) == peers.end()) {
        peers.push_back(w);
      }
    }
  }
  const std::string where =
      absl::StrCat("program '", program.name, "' on devices [",
                   absl::StrJoin(devices, ", "), "]");
  // A peer that does not have it yet (compiling it, or not yet loaded
  // with the program: a host standing by is loaded with a program as its
  // island's workers are) is asked again, at growing intervals, for at
  // most kAwaitPeerCompile: loading once one has compiled costs
  // milliseconds, where compiling along with them costs seconds on the
  // same CPUs. A peer declared down is not waited for, nor one whose own
  // compile of it failed (it answers FAILED_PRECONDITION: it never will
  // have it); nor is it asked again.
  const absl::Time started = absl::Now();
  absl::Duration backoff = absl::Milliseconds(20);
  std::set<int64_t> heard;  // peers whose first refusal was logged
  bool waited = false;      // for a peer to compile it
  while (true) {
    std::vector<int64_t> pending;
    for (int64_t peer : peers) {
      absl::StatusOr<std::shared_ptr<Storage>> bytes =
          FetchExecutable(peer, fingerprint);
      if (!bytes.ok()) {
        // Not there yet (NOT_FOUND), or being compiled there or not reached
        // (UNAVAILABLE); any other answer is final.
        const bool may_come = absl::IsUnavailable(bytes.status()) ||
                              absl::IsNotFound(bytes.status());
        bool down;
        {
          absl::MutexLock lock(&peers_mu_);
          down = peers_down_.contains(peer);
        }
        if (may_come && !down) pending.push_back(peer);
        if (heard.insert(peer).second || !may_come) {
          SPDLOG_INFO("{}: no serialized executable from worker {} ({})", where,
                      peer, bytes.status().ToString());
        }
        continue;
      }
      proto::XlaSerializedExecutable got;
      if (!got.ParseFromArray((*bytes)->data(),
                              static_cast<int>((*bytes)->size())) ||
          got.module() != module ||
          got.compile_options() != island.compile_options()) {
        SPDLOG_WARN("{}: worker {} sent the executable of other content", where,
                    peer);
        continue;
      }
      xla::XlaExecutor::Serialized serialized;
      serialized.module = std::move(*got.mutable_module());
      serialized.compile_options = std::move(*got.mutable_compile_options());
      serialized.executable = std::move(*got.mutable_executable());
      auto exe = xla_->GetOrLoad(serialized, devices);
      if (exe.ok()) {
        SPDLOG_INFO(
            "{}: executable loaded from worker {}, not compiled{}", where, peer,
            waited ? absl::StrCat(" (after waiting ",
                                  absl::FormatDuration(absl::Now() - started),
                                  " for it to be compiled there)")
                   : "");
        return *exe;
      }
      SPDLOG_WARN(
          "{}: the executable serialized by worker {} does not load "
          "here, compiling it: {}",
          where, peer, exe.status().ToString());
      return nullptr;
    }
    if (pending.empty()) return nullptr;
    peers.swap(pending);  // only those it may still come from
    if (absl::Now() + backoff - started > kAwaitPeerCompile) {
      SPDLOG_INFO("{}: no worker had it compiled within {}, compiling it",
                  where, absl::FormatDuration(kAwaitPeerCompile));
      return nullptr;
    }
    if (backoff == absl::Milliseconds(20)) {
      SPDLOG_INFO("{}: waiting for worker(s) {} to compile it", where,
                  absl::StrJoin(peers, ", "));
    }
    {
      // Ends at once when the worker stops.
      absl::MutexLock lock(&compile_mu_);
      if (compile_mu_.AwaitWithTimeout(absl::Condition(&compile_stop_),
                                       backoff)) {
        return nullptr;
      }
    }
    waited = true;
    backoff = std::min(2 * backoff, absl::Milliseconds(500));
  }
}

absl::StatusOr<std::shared_ptr<Storage>> WorkerImpl::FetchExecutable(
    int64_t peer, uint64_t fingerprint) {
  proto::PeerInfo info;
  {
    absl::MutexLock lock(&peers_mu_);
    if (peers_down_.contains(peer)) {
      return absl::UnavailableError("it was declared down");
    }
    auto it = peers_.find(peer);
    if (it == peers_.end()) return absl::NotFoundError("an unknown worker");
    info = it->second;
  }
  transport::DataPlaneIdentity me;
  me.peer = {CredentialRole::kWorker, 0};
  me.credential = secret_.Derive(CredentialRole::kWorker);
  me.generation = generation_.load();
  // A peer that stops answering (SIGSTOP, before it is declared down) costs
  // at most kFetchExecutableTimeout, then this worker compiles.
  const absl::Time deadline = absl::Now() + kFetchExecutableTimeout;
  auto given_up = [this, peer, deadline] {
    absl::MutexLock lock(&peers_mu_);
    return peers_down_.contains(peer) || absl::Now() > deadline;
  };
  const bool same_machine = info.machine_id() == machine_id_;
  auto conn = transport::DataPlaneConnection::Connect(
      info.data_address(), same_machine ? info.unix_path() : "", &counters_, me,
      given_up);
  if (!conn.ok()) return conn.status();
  absl::Notification answered;
  std::thread watchdog([&] {
    if (!answered.WaitForNotificationWithDeadline(deadline))
      (*conn)->Shutdown();
  });
  absl::StatusOr<std::shared_ptr<Storage>> bytes =
      (*conn)->FetchExecutable(fingerprint);
  answered.Notify();
  watchdog.join();
  if (bytes.ok()) {
    counters_.bytes_received.fetch_add(static_cast<int64_t>((*bytes)->size()));
  }
  return bytes;
}

void WorkerImpl::CompileAhead(std::shared_ptr<LoadedProgram> program,
                              bool stand_by) {
  absl::MutexLock lock(&compile_mu_);
  // Its own islands; a host standing by has every island that fits its
  // devices, so that taking a lost host's place costs no compile.
  std::set<std::vector<int>> queued;
  const int num_devices = static_cast<int>(devices_.size());
  for (const auto& island : program->xla->islands()) {
    std::vector<int> devices(island.devices().begin(), island.devices().end());
    bool mine = false;
    for (int64_t w : island.workers()) mine |= w == worker_id_.load();
    const bool fits = std::all_of(devices.begin(), devices.end(),
                                  [&](int d) { return d < num_devices; });
    if (!(mine || (stand_by && fits)) || !queued.insert(devices).second) {
      continue;
    }
    compile_queue_.emplace_back(program, std::move(devices));
  }
  if (!compile_queue_.empty() && !compiler_.joinable()) {
    compiler_ = std::thread([this] { CompilerLoop(); });
  }
}

void WorkerImpl::CompilerLoop() {
  // Compiling ahead is background work: it yields the CPU to execution and
  // to heartbeats (Linux: a thread's nice value is its own, and threads it
  // starts inherit it, as XLA's LLVM pool does on the first compile). The
  // plugin is loaded first, at the worker's priority, so the threads PJRT
  // starts then to execute programs keep it. A load error is each
  // compile's and each call's to report.
  xla_->Runtime().IgnoreError();
  SetThreadName("plexus-compile");
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, tid);
  if (errno == 0 &&
      setpriority(PRIO_PROCESS, tid, std::min(nice + kCompileNice, 19)) != 0) {
    SPDLOG_DEBUG("compiling ahead at the worker's priority: {}",
                 strerror(errno));
  }
  while (true) {
    std::pair<std::shared_ptr<LoadedProgram>, std::vector<int>> job;
    {
      absl::MutexLock lock(&compile_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(compile_mu_) {
        return compile_stop_ || !compile_queue_.empty();
      };
      compile_mu_.Await(absl::Condition(&ready));
      if (compile_stop_) return;
      job = std::move(compile_queue_.front());
      compile_queue_.pop_front();
    }
    // The job holds the program even if its client leaves meanwhile. A
    // failure is cached; the first call reports it.
    auto exe = XlaExecutableFor(*job.first, job.second);
    if (!exe.ok()) {
      SPDLOG_WARN("program '{}': ahead-of-time compile failed: {}",
                  job.first->name, exe.status().ToString());
    }
  }
}

int64_t WorkerImpl::BeginCompile(const LoadedProgram& program,
                                 const std::vector<int>& devices) {
  absl::MutexLock lock(&compiling_mu_);
  const int64_t token = ++next_compile_;
  compiling_[token] = {program.id, program.name, devices, absl::Now()};
  return token;
}

void WorkerImpl::EndCompile(int64_t token) {
  absl::MutexLock lock(&compiling_mu_);
  compiling_.erase(token);
}

void WorkerImpl::StopCompiler() {
  {
    absl::MutexLock lock(&compile_mu_);
    compile_stop_ = true;
    compile_queue_.clear();
  }
  if (compiler_.joinable()) compiler_.join();
}

namespace {

void RecordLocalReads(Timeline& timeline, int64_t worker_id,
                      const proto::Execute& exec,
                      const std::vector<std::vector<xla::XlaArgument>>& inputs,
                      const xla::PjrtRuntime::ArgumentReads& reads,
                      int64_t queued_ns) {
  // A transfer event per argument a partition read on this worker's
  // devices without a transfer between workers: as it is (its own device)
  // or by the plugin's copy from another one; from the run's queueing to
  // now (the copy is queued on the device with the run).
  const int64_t now_ns = reads.empty() ? 0 : timeline.NowNs();
  for (size_t p = 0; p < reads.size() && p < inputs.size(); ++p) {
    if (static_cast<int>(p) >= exec.tasks_size()) break;
    const proto::ShardTask& task = exec.tasks(static_cast<int>(p));
    for (size_t i = 0; i < reads[p].size() && i < inputs[p].size(); ++i) {
      if (reads[p][i] == xla::ArgumentRead::kHost) continue;
      TimelineEvent e;
      e.kind = EventKind::kTransfer;
      e.path = reads[p][i] == xla::ArgumentRead::kAlias
                   ? TransferPath::kAlias
                   : TransferPath::kDeviceToDevice;
      e.start_ns = queued_ns;
      e.end_ns = now_ns;
      e.client_id = exec.client_id();
      e.call_id = exec.call_id();
      e.program_id = exec.program_id();
      const proto::InputBinding* binding =
          static_cast<int>(i) < task.inputs_size()
              ? &task.inputs(static_cast<int>(i))
              : nullptr;
      if (binding != nullptr && binding->pieces_size() > 0) {
        e.buffer_id = binding->pieces(0).buffer_id();
      }
      e.peer = worker_id;
      e.device = task.device();
      e.shard = task.shard();
      e.bytes = static_cast<int64_t>(inputs[p][i].spec.byte_size());
      timeline.Record(e);
    }
  }
}

}  // namespace

absl::Status WorkerImpl::RunXlaPartition(
    const std::shared_ptr<CallContext>& call_ref, int task_index,
    const builtin::KernelContext& ctx,
    const std::vector<const DeviceBuffer*>& input_devices,
    const std::vector<bool>& donate,
    std::vector<std::shared_ptr<Storage>>* outputs) {
  CallContext& call = *call_ref;
  const proto::Execute& exec = call.exec;
  LoadedProgram& program = *call.program;
  const int device = exec.tasks(task_index).device();
  auto named = [&](const absl::Status& s) {
    return absl::Status(
        s.code(), absl::StrCat("program '", program.name, "' failed on worker ",
                               worker_id_.load(), ": ", s.message()));
  };
  // Every partition resolves the executable (compiled once, cached), then
  // charges XLA's scratch memory to its own device's budget while the
  // island runs. A partition that cannot still arrives, failing the island.
  std::vector<int> devices;
  for (const auto& task : exec.tasks()) devices.push_back(task.device());
  auto exe = XlaExecutableFor(program, devices);
  absl::Status ready = exe.status();
  const int64_t scratch = exe.ok() ? (*exe)->temp_bytes() : 0;
  if (ready.ok() && scratch > 0) {
    ready = store_->Reserve(device, scratch);
    if (!ready.ok()) {
      ready = absl::Status(ready.code(),
                           absl::StrCat("XLA scratch memory of ", scratch,
                                        " bytes: ", ready.message()));
    }
  }
  if (!ready.ok()) {
    call.island->Fail(task_index, ready);
    return named(ready);
  }
  std::vector<xla::XlaArgument> inputs;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    inputs.push_back({ctx.inputs[i].spec, ctx.inputs[i].data,
                      i < input_devices.size() ? input_devices[i] : nullptr,
                      i < donate.size() && donate[i]});
  }
  auto run = [&](const IslandExecution::Inputs& in,
                 IslandExecution::DoneFn done)
      -> absl::StatusOr<IslandExecution::Outputs> {
    for (size_t o = 0; o < program.outputs.size(); ++o) {
      const TensorSpec& got = (*exe)->outputs()[o];
      auto local = program.outputs[o].Local(exec.num_shards());
      if (!local.ok()) return local.status();
      if (got != *local) {
        return absl::InternalError(absl::StrCat(
            "XLA compiled output ", o, " as ", got.ToString(),
            " per device, the program declared ", local->ToString()));
      }
    }
    // Queued behind what the device runs already; its inputs need not be
    // ready. The call stays alive until the run's end is handled.
    const int64_t queued_ns = timeline_.enabled() ? timeline_.NowNs() : 0;
    xla::PjrtRuntime::ArgumentReads reads;
    auto out = (*exe)->runtime().Execute(
        **exe, in,
        absl::StrCat("program '", program.name, "' on worker ",
                     worker_id_.load()),
        [call_ref, done = std::move(done)](absl::Status end) { done(end); },
        timeline_.enabled() ? &reads : nullptr);
    if (!out.ok()) return out.status();
    RecordLocalReads(timeline_, worker_id_.load(), exec, in, reads, queued_ns);
    IslandExecution::Outputs result(out->size());
    for (size_t p = 0; p < out->size(); ++p) {
      result[p].assign((*out)[p].begin(), (*out)[p].end());
    }
    return result;
  };
  auto mine = call.island->Arrive(task_index, std::move(inputs), run);
  if (scratch > 0) {
    // XLA's scratch is in use until the run has ended.
    call.island->WhenEnded([this, device, scratch](const absl::Status&) {
      store_->Unreserve(device, scratch);
    });
  }
  if (!mine.ok()) return named(mine.status());
  // A donated input the plugin did not take (its module does not alias it,
  // or another partition's could not be given): its memory is freed when
  // the run ends, and its output was charged in its place meanwhile.
  for (size_t i = 0; i < donate.size(); ++i) {
    if (!donate[i]) continue;
    if (input_devices[i] != nullptr && input_devices[i]->donated()) {
      donations_++;
    } else {
      donations_declined_++;
    }
  }
  for (size_t o = 0; o < outputs->size(); ++o) {
    if ((*outputs)[o] != nullptr) {
      // A `partial` output off partition 0: zeros, so the sum over all
      // devices of the slice is the sum over islands. XLA's is dropped.
      std::memset((*outputs)[o]->data(), 0, (*outputs)[o]->size());
      continue;
    }
    if (o >= mine->size() || (*mine)[o] == nullptr) {
      return named(absl::InternalError(
          absl::StrCat("XLA made no output ", o, " on this partition")));
    }
    (*outputs)[o] = Storage::OnDevice((*mine)[o]);
  }
  return absl::OkStatus();
}

}  // namespace plexus
