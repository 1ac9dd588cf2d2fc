// The executables of XLA programs: cached, loaded from peers or compiled,
// ahead of their calls on the compiler thread or at the first call.
#include "plexus/worker/xla_programs.h"

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
#include "plexus/common/logging.h"
#include "plexus/common/thread_name.h"
#include "plexus/executors/xla/compile_options.h"

namespace plexus {
namespace {

// The workers other than `me` of every island of `program` on the same
// devices with the same module and options: each has compiled (or
// loaded) this content.
std::vector<int64_t> WorkersWithContent(const LoadedProgram& program,
                                        const std::string& module,
                                        const proto::XlaIsland& island,
                                        int64_t me) {
  std::vector<int64_t> peers;
  for (const auto& other : program.xla->islands()) {
    const std::string& its_module =
        other.module().empty() ? program.xla->module() : other.module();
    if (other.compile_options() != island.compile_options() ||
        its_module != module) {
      continue;
    }
    for (int64_t w : other.workers()) {
      if (w != me && std::find(peers.begin(), peers.end(), w) == peers.end()) {
        peers.push_back(w);
      }
    }
  }
  return peers;
}

}  // namespace

XlaPrograms::XlaPrograms(xla::XlaExecutor& xla, ObjectStore& store,
                         PeerTable& peers, const WorkerIdentity& me,
                         Timeline& timeline,
                         transport::DataPlaneCounters& counters, Clock* clock,
                         int num_devices)
    : xla_(xla),
      store_(store),
      peers_(peers),
      me_(me),
      timeline_(timeline),
      counters_(counters),
      clock_(clock),
      num_devices_(num_devices) {}

XlaPrograms::~XlaPrograms() { StopCompiler(); }

std::shared_ptr<const xla::PjrtExecutable> XlaPrograms::ResolvedExecutable(
    LoadedProgram& program, const std::vector<int>& devices) {
  if (!program.xla_mu.TryLock()) return nullptr;
  std::shared_ptr<const xla::PjrtExecutable> found;
  auto it = program.executables.find(devices);
  if (it != program.executables.end()) found = it->second;
  program.xla_mu.Unlock();
  return found;
}

absl::StatusOr<std::shared_ptr<const xla::PjrtExecutable>>
XlaPrograms::ExecutableFor(LoadedProgram& program,
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
        "] of worker ", me_.worker_id.load(),
        " (was the slice re-placed after plexus.jit lowered it?)"));
  }
  auto runtime = xla_.Runtime();
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
      xla_.Lookup(module, island->compile_options());
  const bool names_me =
      std::find(island->workers().begin(), island->workers().end(),
                me_.worker_id.load()) != island->workers().end();
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
    exe = xla_.GetOrCompile(module, island->compile_options());
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

std::shared_ptr<const xla::PjrtExecutable> XlaPrograms::LoadFromPeers(
    const LoadedProgram& program, const std::string& module,
    const proto::XlaIsland& island) {
  const std::vector<int> devices(island.devices().begin(),
                                 island.devices().end());
  const uint64_t fingerprint =
      xla::XlaExecutor::Fingerprint(module, island.compile_options());
  std::vector<int64_t> peers =
      WorkersWithContent(program, module, island, me_.worker_id.load());
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
  const absl::Time started = clock_->Now();
  absl::Duration backoff = absl::Milliseconds(20);
  std::set<int64_t> heard;  // peers whose first refusal was logged
  bool waited = false;      // for a peer to compile it
  while (true) {
    std::vector<int64_t> pending;
    for (int64_t peer : peers) {
      PeerAnswer got = AskPeer(peer, fingerprint, module, island, devices,
                               where, heard.insert(peer).second);
      if (got.kind == PeerAnswer::kLater) pending.push_back(peer);
      if (got.kind == PeerAnswer::kUnloadable) return nullptr;
      if (got.kind != PeerAnswer::kLoaded) continue;
      SPDLOG_INFO(
          "{}: executable loaded from worker {}, not compiled{}", where, peer,
          waited ? absl::StrCat(" (after waiting ",
                                absl::FormatDuration(clock_->Now() - started),
                                " for it to be compiled there)")
                 : "");
      return got.executable;
    }
    if (pending.empty()) return nullptr;
    peers.swap(pending);  // only those it may still come from
    if (clock_->Now() + backoff - started > kAwaitPeerCompile) {
      SPDLOG_INFO("{}: no worker had it compiled within {}, compiling it",
                  where, absl::FormatDuration(kAwaitPeerCompile));
      return nullptr;
    }
    if (backoff == absl::Milliseconds(20)) {
      SPDLOG_INFO("{}: waiting for worker(s) {} to compile it", where,
                  absl::StrJoin(peers, ", "));
    }
    if (!PauseForPeers(backoff)) return nullptr;
    waited = true;
    backoff = std::min(2 * backoff, absl::Milliseconds(500));
  }
}

XlaPrograms::PeerAnswer XlaPrograms::AskPeer(int64_t peer, uint64_t fingerprint,
                                             const std::string& module,
                                             const proto::XlaIsland& island,
                                             const std::vector<int>& devices,
                                             const std::string& where,
                                             bool first_ask) {
  absl::StatusOr<std::shared_ptr<Storage>> bytes =
      FetchExecutable(peer, fingerprint);
  if (!bytes.ok()) {
    // Not there yet (NOT_FOUND), or being compiled there or not reached
    // (UNAVAILABLE); any other answer is final.
    const bool may_come =
        absl::IsUnavailable(bytes.status()) || absl::IsNotFound(bytes.status());
    const bool down = peers_.IsDown(peer);
    if (first_ask || !may_come) {
      SPDLOG_INFO("{}: no serialized executable from worker {} ({})", where,
                  peer, bytes.status().ToString());
    }
    return {may_come && !down ? PeerAnswer::kLater : PeerAnswer::kNone};
  }
  proto::XlaSerializedExecutable got;
  if (!got.ParseFromArray((*bytes)->data(),
                          static_cast<int>((*bytes)->size())) ||
      got.module() != module ||
      got.compile_options() != island.compile_options()) {
    SPDLOG_WARN("{}: worker {} sent the executable of other content", where,
                peer);
    return {PeerAnswer::kNone};
  }
  xla::XlaExecutor::Serialized serialized;
  serialized.module = std::move(*got.mutable_module());
  serialized.compile_options = std::move(*got.mutable_compile_options());
  serialized.executable = std::move(*got.mutable_executable());
  auto exe = xla_.GetOrLoad(serialized, devices);
  if (exe.ok()) return {PeerAnswer::kLoaded, *std::move(exe)};
  SPDLOG_WARN(
      "{}: the executable serialized by worker {} does not load "
      "here, compiling it: {}",
      where, peer, exe.status().ToString());
  return {PeerAnswer::kUnloadable};
}

bool XlaPrograms::PauseForPeers(absl::Duration backoff) {
  absl::MutexLock lock(&compile_mu_);
  const absl::Time until = clock_->Now() + backoff;
  while (!compile_stop_ &&
         !clock_->AwaitWithDeadline(&compile_mu_, &compile_wake_, until)) {
  }
  return !compile_stop_;
}

absl::StatusOr<std::shared_ptr<Storage>> XlaPrograms::FetchExecutable(
    int64_t peer, uint64_t fingerprint) {
  // A peer that stops answering (SIGSTOP, before it is declared down) costs
  // at most kFetchExecutableTimeout, then this worker compiles.
  const absl::Time deadline = clock_->Now() + kFetchExecutableTimeout;
  auto given_up = [this, peer, deadline] {
    return peers_.IsDown(peer) || clock_->Now() > deadline;
  };
  auto conn = peers_.Connect(peer, given_up);
  if (!conn.ok()) return conn.status();
  absl::Mutex answer_mu;
  absl::CondVar answer_cv;
  bool answered = false;
  std::thread watchdog([&] {
    bool late;
    {
      absl::MutexLock lock(&answer_mu);
      while (!answered &&
             !clock_->AwaitWithDeadline(&answer_mu, &answer_cv, deadline)) {
      }
      late = !answered;
    }
    if (late) (*conn)->Shutdown();
  });
  absl::StatusOr<std::shared_ptr<Storage>> bytes =
      (*conn)->FetchExecutable(fingerprint);
  {
    absl::MutexLock lock(&answer_mu);
    answered = true;
    answer_cv.SignalAll();
  }
  watchdog.join();
  if (bytes.ok()) {
    counters_.bytes_received.fetch_add(static_cast<int64_t>((*bytes)->size()));
  }
  return bytes;
}

void XlaPrograms::CompileAhead(std::shared_ptr<LoadedProgram> program,
                               bool stand_by) {
  absl::MutexLock lock(&compile_mu_);
  // Its own islands; a host standing by has every island that fits its
  // devices, so that taking a lost host's place costs no compile.
  std::set<std::vector<int>> queued;
  for (const auto& island : program->xla->islands()) {
    std::vector<int> devices(island.devices().begin(), island.devices().end());
    bool mine = false;
    for (int64_t w : island.workers()) mine |= w == me_.worker_id.load();
    const bool fits = std::all_of(devices.begin(), devices.end(),
                                  [&](int d) { return d < num_devices_; });
    if (!(mine || (stand_by && fits)) || !queued.insert(devices).second) {
      continue;
    }
    compile_queue_.emplace_back(program, std::move(devices));
  }
  if (!compile_queue_.empty() && !compiler_.joinable()) {
    compiler_ = std::thread([this] { CompilerLoop(); });
  }
}

void XlaPrograms::CompilerLoop() {
  // Compiling ahead is background work: it yields the CPU to execution and
  // to heartbeats (Linux: a thread's nice value is its own, and threads it
  // starts inherit it, as XLA's LLVM pool does on the first compile). The
  // plugin is loaded first, at the worker's priority, so the threads PJRT
  // starts then to execute programs keep it. A load error is each
  // compile's and each call's to report.
  xla_.Runtime().IgnoreError();
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
    auto exe = ExecutableFor(*job.first, job.second);
    if (!exe.ok()) {
      SPDLOG_WARN("program '{}': ahead-of-time compile failed: {}",
                  job.first->name, exe.status().ToString());
    }
  }
}

int64_t XlaPrograms::BeginCompile(const LoadedProgram& program,
                                  const std::vector<int>& devices) {
  absl::MutexLock lock(&compiling_mu_);
  const int64_t token = ++next_compile_;
  compiling_[token] = {program.id, program.name, devices, clock_->Now()};
  return token;
}

void XlaPrograms::EndCompile(int64_t token) {
  absl::MutexLock lock(&compiling_mu_);
  compiling_.erase(token);
}

void XlaPrograms::StopCompiler() {
  {
    absl::MutexLock lock(&compile_mu_);
    compile_stop_ = true;
    compile_queue_.clear();
    compile_wake_.SignalAll();
  }
  if (compiler_.joinable()) compiler_.join();
}

void XlaPrograms::AddCompiling(proto::WorkerStats* stats) {
  absl::MutexLock lock(&compiling_mu_);
  if (compiling_.empty()) return;  // most beats: no clock reading
  const absl::Time now = clock_->Now();
  for (const auto& [token, c] : compiling_) {
    proto::CompileInProgress& p = *stats->add_compiling();
    p.set_program_id(c.program_id);
    p.set_program(c.program);
    for (int d : c.devices) p.add_devices(d);
    p.set_elapsed_ms(absl::ToInt64Milliseconds(now - c.started));
  }
}

}  // namespace plexus
