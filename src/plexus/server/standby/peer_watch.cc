#include "plexus/server/standby/peer_watch.h"

#include <utility>

#include "grpcpp/client_context.h"
#include "plexus/common/logging.h"
#include "plexus/common/tls.h"
#include "plexus/proto/plexus.grpc.pb.h"

namespace plexus {

bool PeerServes(const std::string& address, const std::string& tls_ca,
                absl::Duration timeout) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SessionChannel(address, tls_ca);
  if (!channel.ok()) return false;
  std::unique_ptr<proto::Controller::Stub> stub =
      proto::Controller::NewStub(*channel);
  grpc::ClientContext ctx;
  // Real time: a deadline handed to gRPC.
  ctx.set_deadline(absl::ToChronoTime(Clock::Real()->Now() + timeout));
  proto::StatusRequest request;
  request.set_why_after_ms(-1);  // no walk of the waits: a yes is enough
  proto::ClusterStatus status;
  return stub->GetStatus(&ctx, request, &status).ok();
}

PeerWatch::PeerWatch(PeerWatchOptions options, std::function<void()> on_serves)
    : options_(std::move(options)), on_serves_(std::move(on_serves)) {
  thread_ = std::thread([this] { Loop(); });
}

PeerWatch::~PeerWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void PeerWatch::Arm(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (armed_ || stop_) return;
  armed_ = true;
  ++arms_;
  SPDLOG_INFO(
      "{}: asking the other server at {} whether it took over (every {})", why,
      options_.peer, absl::FormatDuration(options_.period));
  cv_.SignalAll();
}

void PeerWatch::Disarm() {
  absl::MutexLock lock(&mu_);
  armed_ = false;
}

bool PeerWatch::armed() const {
  absl::MutexLock lock(&mu_);
  return armed_;
}

void PeerWatch::Loop() {
  Clock& clock = *options_.clock;
  while (true) {
    uint64_t asked_at_arm;  // arms_ when this question was asked
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || armed_;
      };
      mu_.Await(absl::Condition(&wake));
      if (stop_) return;
      asked_at_arm = arms_;
    }
    const bool serves =
        options_.serves
            ? options_.serves(options_.peer, options_.timeout)
            : PeerServes(options_.peer, options_.tls_ca, options_.timeout);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (!serves || !armed_) {
        // The next question a period on; at once if it was disarmed and
        // armed again while this one was asked (that Arm's signal came
        // before this wait: a wait for it alone never ended on a clock
        // that does not move by itself).
        const absl::Time next = clock.Now() + options_.period;
        while (!stop_ && arms_ == asked_at_arm && clock.Now() < next) {
          clock.AwaitWithDeadline(&mu_, &cv_, next);
        }
        continue;
      }
      armed_ = false;
      stop_ = true;  // once
    }
    on_serves_();  // outside the lock: it shuts the server down
    return;
  }
}

}  // namespace plexus
