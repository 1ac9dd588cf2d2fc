// WorkerHost: a host's worker over successive server sessions. See worker.h.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/worker/worker.h"

namespace plexus {

bool ShouldRejoin(const absl::Status& status, bool standalone,
                  bool session_ended) {
  switch (status.code()) {
    // Refused for good: another release, another cluster's secret, bad
    // options. Trying again cannot help.
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kInvalidArgument:
      return false;
    default:
      break;
  }
  if (standalone) return true;  // the server restarts, the network heals
  // Embedded: a session the server ended (it declared this host down, or
  // it is shutting down) is worth one registration: a server that still
  // answers takes the host back, one shutting down refuses it. A server
  // that vanished is gone for good (and takes its workers with it).
  return session_ended && absl::IsCancelled(status);
}

namespace {
constexpr absl::Duration kEmbeddedRejoinTimeout = absl::Seconds(2);
}  // namespace

WorkerHost::WorkerHost(WorkerOptions worker, WorkerHostOptions host)
    : options_(std::move(worker)), host_(host) {
  // A standalone host retries on its own schedule (the back-off): each
  // attempt waits for the server only briefly, and a shutdown is never
  // held up for long.
  if (host_.standalone) {
    options_.connect_timeout =
        std::min(options_.connect_timeout, absl::Seconds(2));
  }
}

WorkerHost::~WorkerHost() {
  Shutdown();
  WaitTeardown();
}

bool WorkerHost::Retire(std::unique_ptr<Worker> worker) {
  WaitTeardown();  // one at a time
  const int64_t id = worker->worker_id();
  auto done = std::make_shared<absl::Notification>();
  std::thread teardown([worker = std::move(worker), done]() mutable {
    worker.reset();
    done->Notify();
  });
  if (done->WaitForNotificationWithTimeout(host_.teardown_grace)) {
    teardown.join();
    return true;
  }
  SPDLOG_WARN(
      "the teardown of worker {}'s session has not finished after {}: a "
      "device is still in a kernel (a running program cannot be "
      "interrupted)",
      id, absl::FormatDuration(host_.teardown_grace));
  teardown_ = std::move(teardown);
  teardown_done_ = std::move(done);
  return false;
}

void WorkerHost::WaitTeardown() {
  if (teardown_.joinable()) teardown_.join();
  teardown_done_.reset();
}

bool WorkerHost::TeardownPending() const {
  return teardown_done_ != nullptr && !teardown_done_->HasBeenNotified();
}

WorkerHost::Kept WorkerHost::KeepAcross(Worker& worker, Backoff& backoff) {
  SPDLOG_WARN(
      "the server went away; worker {} keeps its buffers and programs and "
      "asks the next server to take it back",
      worker.worker_id());
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return Kept::kStopped;
    }
    absl::StatusOr<bool> resumed = worker.Resume(host_.teardown_grace);
    // Taken back, or a fresh host with what it kept dropped: it serves.
    if (resumed.ok()) return Kept::kResumed;
    std::optional<absl::Duration> delay =
        backoff.NextDelay(options_.clock->Now());
    if (!delay.has_value()) return Kept::kGaveUp;
    SPDLOG_WARN(
        "registration with {} (to resume) failed ({}); attempt {} in {}",
        options_.server_address, resumed.status().ToString(),
        backoff.failures() + 1, absl::FormatDuration(*delay));
    if (!Pause(*delay)) return Kept::kStopped;
  }
}

void WorkerHost::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  if (current_ != nullptr) current_->Shutdown();
}

bool WorkerHost::Pause(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), delay);
  return !stop_;
}

absl::Status WorkerHost::Run(
    const std::function<void(const Worker&)>& on_registered) {
  const absl::Status stopped = absl::CancelledError("worker shut down");
  Backoff backoff(host_.backoff);
  absl::Status session_end;  // how the last session ended (OK: none yet)
  while (true) {
    absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(options_);
    if (worker.ok()) {
      backoff.Reset();
      bool stopping;
      {
        absl::MutexLock lock(&mu_);
        stopping = stop_;
        if (!stopping) current_ = worker->get();
      }
      if (stopping) {
        Retire(*std::move(worker));
        return stopped;
      }
      on_registered(**worker);
      session_end = (*worker)->Wait();
      // The server went away: a standalone host keeps what it holds and
      // asks the next server to take it back as the host it was.
      while (host_.standalone && absl::IsUnavailable(session_end)) {
        const Kept kept = KeepAcross(**worker, backoff);
        if (kept != Kept::kResumed) break;
        backoff.Reset();
        on_registered(**worker);
        session_end = (*worker)->Wait();
      }
      options_.previous_worker_id = (*worker)->worker_id();
      options_.previous_generation = (*worker)->generation();
      {
        absl::MutexLock lock(&mu_);
        current_ = nullptr;
        stopping = stop_;
      }
      // Every buffer, program, peer and data-plane connection of the
      // session goes with it: the next registration is a fresh host.
      const bool torn_down = Retire(*std::move(worker));
      if (stopping) return stopped;
      if (!ShouldRejoin(session_end, host_.standalone,
                        /*session_ended=*/true)) {
        return session_end;
      }
      if (!torn_down) {
        if (!host_.standalone) {
          // Its server ended the session (it is shutting down, or declared
          // this host down and replaces it); a late rejoin helps neither.
          SPDLOG_WARN(
              "not registering again: the last session's teardown "
              "still waits for a kernel");
          return session_end;
        }
        SPDLOG_WARN("registering again once the last session's kernel ends");
        WaitTeardown();
      }
      SPDLOG_WARN(
          "the session of worker {} ended ({}); its state is dropped and it "
          "registers again as a fresh host",
          options_.previous_worker_id, session_end.ToString());
      // An embedded host rejoins only a server that still answers, and one
      // that answers does so at once: a server that shut down must not
      // hold its workers' exit for the whole first-connect timeout (10 s).
      if (!host_.standalone) {
        options_.connect_timeout =
            std::min(options_.connect_timeout, kEmbeddedRejoinTimeout);
      }
      continue;  // the first attempt at once
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return stopped;
    }
    if (!ShouldRejoin(worker.status(), host_.standalone,
                      /*session_ended=*/false)) {
      // An embedded host whose server will not take it back ends as its
      // session did (a server that ended it on purpose: a clean exit).
      return session_end.ok() ? worker.status() : session_end;
    }
    std::optional<absl::Duration> delay =
        backoff.NextDelay(options_.clock->Now());
    if (!delay.has_value()) {
      SPDLOG_ERROR("giving up: no registration with {} for {} ({})",
                   options_.server_address,
                   absl::FormatDuration(host_.backoff.give_up_after),
                   worker.status().ToString());
      return worker.status();
    }
    SPDLOG_WARN("registration with {} failed ({}); attempt {} in {}",
                options_.server_address, worker.status().ToString(),
                backoff.failures() + 1, absl::FormatDuration(*delay));
    if (!Pause(*delay)) return stopped;
  }
}

}  // namespace plexus
