#include "plexus/sim/sim_data_plane.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/ids.h"

namespace plexus::sim {
namespace {

absl::Status NoData() {
  return absl::UnimplementedError(
      "a simulated host (plexus-sim-workers) holds no data: only WAIT is "
      "served");
}

std::shared_ptr<const Storage> Token() {
  absl::StatusOr<std::shared_ptr<Storage>> one = Storage::Allocate(1);
  return one.ok() ? std::shared_ptr<const Storage>(*std::move(one)) : nullptr;
}

}  // namespace

SimDataPlane::SimDataPlane(const ClusterSecret& secret, OpsSink ops)
    : secret_(secret), ops_(std::move(ops)), token_(Token()) {}

SimDataPlane::~SimDataPlane() { Shutdown(); }

void SimDataPlane::MarkReady(const std::vector<ShardKey>& keys) {
  std::vector<std::shared_ptr<absl::Notification>> wake;
  {
    absl::MutexLock lock(&mu_);
    for (const ShardKey& key : keys) {
      keys_.insert_or_assign(key, absl::OkStatus());
      if (auto it = waiters_.find(key); it != waiters_.end()) {
        for (auto& w : it->second) wake.push_back(std::move(w));
        waiters_.erase(it);
      }
    }
  }
  for (auto& w : wake) w->Notify();
}

void SimDataPlane::MarkFailed(uint64_t buffer, const absl::Status& why) {
  std::vector<std::shared_ptr<absl::Notification>> wake;
  {
    absl::MutexLock lock(&mu_);
    failed_.insert_or_assign(buffer, why);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->first.buffer_id != buffer) {
        ++it;
        continue;
      }
      for (auto& w : it->second) wake.push_back(std::move(w));
      waiters_.erase(it++);
    }
  }
  for (auto& w : wake) w->Notify();
}

void SimDataPlane::Forget(const std::vector<ShardKey>& keys) {
  absl::MutexLock lock(&mu_);
  for (const ShardKey& key : keys) {
    keys_.erase(key);
    failed_.erase(key.buffer_id);
  }
}

void SimDataPlane::Shutdown() {
  absl::flat_hash_map<ShardKey,
                      std::vector<std::shared_ptr<absl::Notification>>>
      wake;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    wake.swap(waiters_);
  }
  for (auto& [key, list] : wake) {
    for (auto& w : list) w->Notify();
  }
}

int64_t SimDataPlane::keys_held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(keys_.size() + failed_.size());
}

const absl::Status* SimDataPlane::AnswerLocked(const ShardKey& key) const {
  if (auto f = failed_.find(key.buffer_id); f != failed_.end()) {
    return &f->second;
  }
  if (auto k = keys_.find(key); k != keys_.end()) return &k->second;
  return nullptr;
}

absl::StatusOr<std::shared_ptr<const Storage>> SimDataPlane::AwaitReady(
    const ShardKey& key) {
  auto woken = std::make_shared<absl::Notification>();
  {
    absl::MutexLock lock(&mu_);
    if (const absl::Status* answer = AnswerLocked(key)) {
      if (!answer->ok()) return *answer;
      return token_;
    }
    if (shutdown_) return absl::CancelledError("the simulated hosts stopped");
    waiters_[key].push_back(woken);
  }
  woken->WaitForNotification();
  absl::MutexLock lock(&mu_);
  if (const absl::Status* answer = AnswerLocked(key)) {
    if (!answer->ok()) return *answer;
    return token_;
  }
  return absl::CancelledError("the simulated hosts stopped");
}

absl::StatusOr<Credential> SimDataPlane::CredentialFor(
    const transport::DataPlanePeer& peer) {
  if (peer.role == CredentialRole::kClient) {
    return secret_.Derive(CredentialRole::kClient, peer.id);
  }
  if (peer.role == CredentialRole::kServer && peer.id == 0 && ops_.apply) {
    return secret_.Derive(CredentialRole::kServer);
  }
  return absl::PermissionDeniedError(
      ops_.apply ? "a simulated host serves client sessions and the server's "
                   "ops only"
                 : "a simulated host serves client sessions only");
}

absl::Status SimDataPlane::Authorize(transport::DataPlaneRequest request,
                                     const ShardKey& key,
                                     const transport::DataPlanePeer& peer) {
  if (absl::Status s = transport::CheckOpsPeer(request, peer); !s.ok()) {
    return s;
  }
  if (peer.role == CredentialRole::kServer) return absl::OkStatus();
  if (request != transport::DataPlaneRequest::kWait) return NoData();
  // An id names its owner; only the owner's connection waits on it.
  if (peer.role == CredentialRole::kClient &&
      peer.id == ClientOfBuffer(key.buffer_id)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("buffer ", key.buffer_id, " belongs to client ",
                   ClientOfBuffer(key.buffer_id)));
}

absl::Status SimDataPlane::AdmitIncoming(const ShardKey& key, size_t bytes,
                                         bool from_client) {
  return NoData();
}

absl::StatusOr<std::shared_ptr<Storage>> SimDataPlane::AllocateIncoming(
    const ShardKey& key, size_t bytes, bool from_client) {
  return NoData();
}

absl::Status SimDataPlane::Deliver(const ShardKey& key,
                                   std::shared_ptr<Storage> data,
                                   bool from_client) {
  return NoData();
}

absl::Status SimDataPlane::ApplyOps(const transport::DataPlanePeer& peer,
                                    uint64_t generation, std::string& message) {
  if (!ops_.apply) return DataPlaneHandler::ApplyOps(peer, generation, message);
  return ops_.apply(generation, message);
}

absl::Status SimDataPlane::OpsConnectionOpened(const transport::DataPlanePeer&,
                                               uint64_t generation, int fd) {
  if (!ops_.opened) return absl::OkStatus();
  return ops_.opened(generation, fd);
}

void SimDataPlane::OpsEnded(const transport::DataPlanePeer&,
                            uint64_t generation, const absl::Status& why) {
  if (ops_.ended) ops_.ended(generation, why);
}

bool SimDataPlane::TakeOpsConnection(const transport::DataPlanePeer&,
                                     uint64_t generation, int fd) {
  return ops_.take && ops_.take(generation, fd);
}

}  // namespace plexus::sim
