#include "plexus/worker/ops_inbox.h"

#include <utility>

namespace plexus {

void OpsInbox::Push(proto::ServerToWorker msg) {
  const size_t bytes = msg.ByteSizeLong();
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || bytes_ < max_bytes_;
  };
  mu_.Await(absl::Condition(&room));
  if (closed_) return;
  bytes_ += bytes;
  messages_.emplace_back(std::move(msg), bytes);
}

bool OpsInbox::Pop(proto::ServerToWorker* msg) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !messages_.empty();
  };
  mu_.Await(absl::Condition(&ready));
  if (messages_.empty()) return false;
  *msg = std::move(messages_.front().first);
  bytes_ -= messages_.front().second;
  messages_.pop_front();
  return true;
}

void OpsInbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace plexus
