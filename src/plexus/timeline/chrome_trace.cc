#include "plexus/timeline/chrome_trace.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/timeline/timeline.h"

namespace plexus {
namespace {

std::string Quoted(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// Tracks (Chrome "threads") of a process.
constexpr int kCallsTid = 1;
constexpr int kAdmissionTid = 2;
constexpr int kRecoveryTid = 3;
constexpr int kCompileTid = 4;
constexpr int kDataPlaneTid = 5;
constexpr int kSlicesTid = 6;
constexpr int kDeviceTid = 100;   // + device index
constexpr int kLocalTid = 50000;  // + device index: transfers within a worker
constexpr int kPeerTid = 100000;  // + destination worker id

struct TaskRef {
  int ring;
  int event;
  int32_t device;
};

class Writer {
 public:
  explicit Writer(const proto::TraceReply& trace) : trace_(trace) {
    for (const proto::ProgramName& p : trace.programs()) {
      programs_[{p.client_id(), p.program_id()}] = p.name();
    }
    for (const proto::ClientCallSite& s : trace.sites()) {
      sites_[{s.client_id(), s.site()}] = s.text();
    }
    origin_ = std::numeric_limits<int64_t>::max();
    for (const proto::TimelineRing& r : trace.rings()) {
      for (const proto::TimelineEvent& e : r.events()) {
        origin_ = std::min(origin_, e.start_ns() + r.offset_ns());
      }
    }
    if (origin_ == std::numeric_limits<int64_t>::max()) origin_ = 0;
    // Consumers of transfers: the tasks of each call on each worker.
    for (int i = 0; i < trace.rings_size(); ++i) {
      const proto::TimelineRing& r = trace.rings(i);
      for (int j = 0; j < r.events_size(); ++j) {
        const proto::TimelineEvent& e = r.events(j);
        if (e.kind() != static_cast<int>(EventKind::kTask)) continue;
        tasks_[{r.worker_id(), e.client_id(), e.call_id()}].push_back(
            {i, j, e.device()});
      }
    }
  }

  std::string Write() {
    out_ = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
    for (int i = 0; i < trace_.rings_size(); ++i) WriteRing(i);
    for (const auto& [target, flows] : flow_ins_) {
      (void)target;
      for (const std::string& f : flows) Append(f);
    }
    out_ += "\n],\"plexus\":{\"processes\":[";
    for (int i = 0; i < trace_.rings_size(); ++i) {
      const proto::TimelineRing& r = trace_.rings(i);
      absl::StrAppend(
          &out_, i > 0 ? "," : "", "{\"pid\":", i + 1,
          ",\"name\":", Quoted(ProcessName(r)),
          ",\"worker_id\":", r.worker_id(), ",\"client_id\":", r.client_id(),
          ",\"host\":", Quoted(r.host_name()), ",\"offset_ns\":", r.offset_ns(),
          ",\"offset_error_ns\":", r.offset_error_ns(),
          ",\"events\":", r.events_size(), ",\"recorded\":", r.recorded(),
          ",\"dropped\":", r.dropped(), ",\"capacity\":", r.capacity(), "}");
    }
    absl::StrAppend(&out_, "],\"origin_ns\":", origin_,
                    ",\"flows\":", next_flow_, ",\"missing\":[");
    for (int i = 0; i < trace_.missing_size(); ++i) {
      absl::StrAppend(&out_, i > 0 ? "," : "", Quoted(trace_.missing(i)));
    }
    out_ += "]}}\n";
    return std::move(out_);
  }

 private:
  static std::string ProcessName(const proto::TimelineRing& r) {
    if (r.client_id() != 0) return r.process();
    if (r.worker_id() == 0) return "server";
    return absl::StrCat(r.host_name(), " (worker ", r.worker_id(), ")");
  }

  std::string Program(uint64_t client, uint64_t program) const {
    auto it = programs_.find({client, program});
    return it != programs_.end() ? it->second
                                 : absl::StrCat("program ", program);
  }

  double Us(int64_t ns, int64_t offset) const {
    return static_cast<double>(ns + offset - origin_) / 1000.0;
  }

  void Append(const std::string& event) {
    if (!first_) out_ += ",\n";
    first_ = false;
    out_ += event;
  }

  void Thread(int pid, int tid, const std::string& name) {
    if (!threads_.emplace(pid, tid).second) return;
    Append(absl::StrCat("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", pid,
                        ",\"tid\":", tid, ",\"args\":{\"name\":", Quoted(name),
                        "}}"));
    Append(absl::StrCat(
        "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":", pid,
        ",\"tid\":", tid, ",\"args\":{\"sort_index\":", tid, "}}"));
  }

  std::string Args(const proto::TimelineEvent& e,
                   const proto::TimelineRing& r) const {
    std::string a = "{";
    auto field = [&](const char* k, auto v) {
      absl::StrAppend(&a, a.size() > 1 ? "," : "", "\"", k, "\":", v);
    };
    if (e.client_id() != 0) field("client", e.client_id());
    if (e.call_id() != 0) field("call", e.call_id());
    if (e.program_id() != 0) field("program", e.program_id());
    if (e.buffer_id() != 0) field("buffer", e.buffer_id());
    if (e.graph_id() != 0) field("graph", e.graph_id());
    if (e.device() >= 0) field("device", e.device());
    if (e.shard() >= 0) field("shard", e.shard());
    if (e.peer() != 0) field("peer_worker", e.peer());
    if (e.bytes() != 0) {
      const bool charge =
          static_cast<EventKind>(e.kind()) == EventKind::kAdmissionWait;
      field(charge ? "charged_us" : "bytes", e.bytes());
    }
    if (e.path() != 0) {
      field("path",
            Quoted(TransferPathName(static_cast<TransferPath>(e.path()))));
    }
    if (e.failed()) field("failed", "true");
    if (r.worker_id() != 0) field("worker", r.worker_id());
    absl::StrAppend(&a, a.size() > 1 ? "," : "",
                    "\"duration_us\":", (e.end_ns() - e.start_ns()) / 1000.0);
    a += "}";
    return a;
  }

  void Complete(int pid, int tid, const std::string& name, const char* cat,
                const proto::TimelineEvent& e, const proto::TimelineRing& r) {
    Append(absl::StrFormat(
        "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
        "\"name\":%s,\"cat\":\"%s\",\"args\":%s}",
        pid, tid, Us(e.start_ns(), r.offset_ns()),
        std::max<int64_t>(e.end_ns() - e.start_ns(), 0) / 1000.0, Quoted(name),
        cat, Args(e, r)));
  }

  // An async slice: these overlap on their track (calls in flight, client
  // requests served on several connections at once).
  void Async(int pid, int tid, const std::string& name, const char* cat,
             const proto::TimelineEvent& e, const proto::TimelineRing& r) {
    const uint64_t id = ++next_async_;
    Append(absl::StrFormat(
        "{\"ph\":\"b\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"name\":%s,"
        "\"cat\":\"%s\",\"id\":%d,\"args\":%s}",
        pid, tid, Us(e.start_ns(), r.offset_ns()), Quoted(name), cat, id,
        Args(e, r)));
    Append(absl::StrFormat(
        "{\"ph\":\"e\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"name\":%s,"
        "\"cat\":\"%s\",\"id\":%d}",
        pid, tid, Us(std::max(e.end_ns(), e.start_ns()), r.offset_ns()),
        Quoted(name), cat, id));
  }

  // A flow from transfer `e` (ring `r`, process `pid`, its track `tid`) to
  // the task that reads it on the destination, if it is in the trace.
  void Flow(int pid, int tid, const proto::TimelineEvent& e,
            const proto::TimelineRing& r) {
    if (e.call_id() == 0) return;
    auto it = tasks_.find({e.peer(), e.client_id(), e.call_id()});
    if (it == tasks_.end()) return;
    const TaskRef* to = &it->second.front();
    for (const TaskRef& t : it->second) {
      if (t.device == e.device()) {
        to = &t;
        break;
      }
    }
    const proto::TimelineRing& dr = trace_.rings(to->ring);
    const proto::TimelineEvent& task = dr.events(to->event);
    const uint64_t id = ++next_flow_;
    // "s" where the transfer began, "f" bound to the task's slice. Its
    // start, not its end: the sender stamps its end after the last byte
    // went out, which a busy sender may do after the reader's task already
    // ran; the start is before anything arrived, so before the task ended.
    const int64_t s_ns = e.start_ns();
    Append(absl::StrFormat(
        "{\"ph\":\"s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"name\":"
        "\"transfer\",\"cat\":\"flow\",\"id\":%d}",
        pid, tid, Us(s_ns, r.offset_ns()), id));
    // The task's slice includes its wait for inputs: the arrow ends at
    // the transfer's start if the task was waiting then, else where the
    // task began (server's clock).
    const int64_t f_ns = std::max(
        task.start_ns() + dr.offset_ns(),
        std::min(s_ns + r.offset_ns(), task.end_ns() + dr.offset_ns()));
    flow_ins_[{to->ring, to->event}].push_back(absl::StrFormat(
        "{\"ph\":\"f\",\"bp\":\"e\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
        "\"name\":\"transfer\",\"cat\":\"flow\",\"id\":%d}",
        to->ring + 1, kDeviceTid + std::max(task.device(), 0), Us(f_ns, 0),
        id));
  }

  void WriteRing(int i) {
    const proto::TimelineRing& r = trace_.rings(i);
    const int pid = i + 1;
    Append(absl::StrCat("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", pid,
                        ",\"args\":{\"name\":", Quoted(ProcessName(r)), "}}"));
    Append(absl::StrCat(
        "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":", pid,
        ",\"args\":{\"sort_index\":", pid, "}}"));
    auto label = [&](const proto::TimelineEvent& e) -> std::string {
      return e.label() < static_cast<uint32_t>(r.labels_size())
                 ? r.labels(static_cast<int>(e.label()))
                 : std::string();
    };
    for (const proto::TimelineEvent& e : r.events()) {
      switch (static_cast<EventKind>(e.kind())) {
        case EventKind::kCall: {
          // The server's (routed to done), or a client's (issued).
          const bool issued = r.client_id() != 0;
          Thread(pid, kCallsTid, issued ? "calls issued" : "calls");
          std::string name = Program(e.client_id(), e.program_id());
          auto site = sites_.find({e.client_id(), e.label()});
          if (site != sites_.end()) absl::StrAppend(&name, " @ ", site->second);
          Async(pid, kCallsTid, name, issued ? "call issued" : "call", e, r);
          break;
        }
        case EventKind::kAdmissionWait:
          Thread(pid, kAdmissionTid, "admission");
          Async(pid, kAdmissionTid,
                absl::StrCat("admission wait: ",
                             Program(e.client_id(), e.program_id())),
                "admission", e, r);
          break;
        case EventKind::kRecovery:
          Thread(pid, kRecoveryTid, "recovery");
          Async(pid, kRecoveryTid, absl::StrCat("recovery: ", label(e)),
                "recovery", e, r);
          break;
        case EventKind::kResize:
          Thread(pid, kSlicesTid, "slices");
          Async(pid, kSlicesTid, absl::StrCat("resize: ", label(e)), "resize",
                e, r);
          break;
        case EventKind::kTask: {
          const int tid = kDeviceTid + std::max(e.device(), 0);
          Thread(pid, tid, absl::StrCat("device ", e.device()));
          Complete(pid, tid, Program(e.client_id(), e.program_id()), "task", e,
                   r);
          break;
        }
        case EventKind::kTransfer: {
          // Between workers: a track per destination; within this one
          // (read in place, copied between its devices, summed by NCCL): a
          // track per reading device.
          const bool local = IsLocalPath(static_cast<TransferPath>(e.path()));
          const int tid = local ? kLocalTid + std::max(e.device(), 0)
                                : kPeerTid + static_cast<int>(e.peer());
          Thread(pid, tid,
                 local ? absl::StrCat("device ", e.device(), " reads")
                       : absl::StrCat("to worker ", e.peer()));
          Complete(
              pid, tid,
              absl::StrCat(
                  "transfer (",
                  TransferPathName(static_cast<TransferPath>(e.path())), ")"),
              "transfer", e, r);
          Flow(pid, tid, e, r);
          break;
        }
        case EventKind::kCompile:
        case EventKind::kLoad:
          Thread(pid, kCompileTid, "compile");
          Async(pid, kCompileTid,
                absl::StrCat(EventKindName(static_cast<EventKind>(e.kind())),
                             " ", label(e)),
                "compile", e, r);
          break;
        case EventKind::kPut:
        case EventKind::kFetch:
        case EventKind::kWait:
          if (r.client_id() != 0) {  // the client's own, as it made them
            Thread(pid, kDataPlaneTid, "puts, fetches, waits");
            Async(pid, kDataPlaneTid,
                  EventKindName(static_cast<EventKind>(e.kind())), "client", e,
                  r);
            break;
          }
          Thread(pid, kDataPlaneTid, "client data plane");
          Async(pid, kDataPlaneTid,
                absl::StrCat(
                    EventKindName(static_cast<EventKind>(e.kind())),
                    e.path() != 0 ? " (" : "",
                    e.path() != 0
                        ? TransferPathName(static_cast<TransferPath>(e.path()))
                        : "",
                    e.path() != 0 ? ")" : ""),
                "data plane", e, r);
          break;
        case EventKind::kNone:
          break;
      }
    }
  }

  const proto::TraceReply& trace_;
  std::map<std::pair<uint64_t, uint64_t>, std::string> programs_;
  std::map<std::pair<uint64_t, uint32_t>, std::string> sites_;
  std::map<std::tuple<int64_t, uint64_t, uint64_t>, std::vector<TaskRef>>
      tasks_;
  std::map<std::pair<int, int>, std::vector<std::string>> flow_ins_;
  std::set<std::pair<int, int>> threads_;
  int64_t origin_ = 0;
  uint64_t next_async_ = 0;
  uint64_t next_flow_ = 0;
  bool first_ = true;
  std::string out_;
};

}  // namespace

std::string ChromeTraceJson(const proto::TraceReply& trace) {
  return Writer(trace).Write();
}

}  // namespace plexus
