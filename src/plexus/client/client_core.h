// Internal: the state behind a Client, shared with its slices and futures
// (shared_ptr: futures may outlive the Client object, e.g. in Python; a
// release after Close is then a no-op). A thin coordinator of the client's
// two halves, which it owns and wires together:
//   - ClientSession (client_session.h): the connection to the server
//     (handshake, batches of ops, reconnect and restore, server events);
//   - DataPath (data_path.h): puts, fetches and waits, to workers over the
//     data plane; it hears the session's events (SessionObserver) and asks
//     the session for what its errors report.
// Besides, it holds what a Client shares across both: the options, the
// client's timeline, its call sites and the call and future counters.
//
// Thread-safe. Lock order: the session's lock, then the data path's;
// CallSites' lock is taken alone.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "plexus/client/client.h"
#include "plexus/client/client_session.h"
#include "plexus/client/data_path.h"
#include "plexus/timeline/timeline.h"

namespace plexus {

// Call sites (proto::CallSite, for the timeline): an id per text, and the
// op that registers a site with the server once per session (the server
// forgets sites with the session). Thread-safe.
class CallSites {
 public:
  static constexpr size_t kMaxCallSites = 4096;
  // The id of `text` (the same every time; 0 past kMaxCallSites).
  uint32_t Id(const std::string& text);
  // Fills `op` with the registration of `site` if the session of `epoch`
  // has not had it yet (true), else leaves it (false).
  bool Op(uint32_t site, uint64_t epoch, proto::ClientOp* op);

 private:
  absl::Mutex mu_;
  std::vector<std::string> sites_ ABSL_GUARDED_BY(mu_);  // id - 1
  absl::flat_hash_map<std::string, uint32_t> site_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t sites_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> sites_sent_ ABSL_GUARDED_BY(mu_);  // in that epoch
};

class ClientCore : public std::enable_shared_from_this<ClientCore> {
 public:
  explicit ClientCore(ClientOptions options);
  ~ClientCore();  // Close()
  // Opens the first session with the server at `address`.
  absl::Status Init(const std::string& address);
  // Ends the session (the server frees the client's slices and buffers)
  // and drops the data path's connections and kept puts.
  void Close();
  bool closed() const { return session_.closed(); }

  ClientSession& session() { return session_; }
  const ClientSession& session() const { return session_; }
  DataPath& data() { return data_; }
  const DataPath& data() const { return data_; }
  const ClientOptions& options() const { return options_; }
  uint64_t client_id() const { return session_.client_id(); }

  // The client's own timeline (timeline/timeline.h): one event per put,
  // fetch and wait it made and per call it issued, recorded on the calling
  // thread (no lock held across I/O). $PLEXUS_TIMELINE_EVENTS sizes it (0:
  // off); $PLEXUS_TEST_TIMELINE_SKEW_MS's "client" skews its clock.
  Timeline& timeline() { return timeline_; }
  CallSites& call_sites() { return call_sites_; }

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> live_futures{0};

 private:
  const ClientOptions options_;
  Timeline timeline_;
  CallSites call_sites_;
  // The data path before the session: built first, destroyed last (the
  // session's threads call it until Close joins them).
  DataPath data_;
  ClientSession session_;
};

// One sharded buffer as the client holds it, in the session that made it.
// The last Future copy destroys it, which releases the buffer on the
// workers (if that session is still open).
class BufferHandle {
 public:
  // `issued`: its op is already queued (ClientSession::NoteLive).
  BufferHandle(std::shared_ptr<ClientCore> core, uint64_t id, ArgSpec arg,
               std::shared_ptr<Slice> slice,
               std::shared_ptr<SessionTag> session, bool issued = true)
      : core_(std::move(core)),
        id_(id),
        arg_(std::move(arg)),
        slice_(std::move(slice)),
        session_(std::move(session)) {
    core_->live_futures++;
    session_->live_futures++;
    core_->session().NoteLive(id_, slice_->id(), arg_, issued);
  }
  ~BufferHandle() {
    core_->live_futures--;
    session_->live_futures--;
    core_->session().ForgetBuffer(id_);
    // A donated buffer was released by the call it was donated to.
    if (!donated()) {
      core_->session().ReleaseBuffer(id_, slice_->id(), session_->epoch);
    }
  }
  // Donation (a program's donated input): true the first time, and the
  // caller then releases the buffer after the call that consumes it.
  bool Donate() { return !donated_.exchange(true); }
  bool donated() const { return donated_.load(); }
  uint64_t id() const { return id_; }
  uint64_t epoch() const { return session_->epoch; }
  // The id the value has now: recovery may have recomputed it under
  // another (ClientSession::Resolve).
  uint64_t current_id() const { return core_->session().Resolve(id_); }
  // current_id() and the slice's map it is on, read together
  // (ClientSession::ResolveOn): what a read of its shards goes by.
  std::pair<uint64_t, const proto::SliceInfo*> placed() const {
    return core_->session().ResolveOn(id_, *slice_);
  }
  const ArgSpec& arg() const { return arg_; }
  const std::shared_ptr<Slice>& slice() const { return slice_; }

 private:
  std::shared_ptr<ClientCore> core_;
  uint64_t id_;
  ArgSpec arg_;
  std::shared_ptr<Slice> slice_;
  std::shared_ptr<SessionTag> session_;
  std::atomic<bool> donated_{false};
};

}  // namespace plexus
