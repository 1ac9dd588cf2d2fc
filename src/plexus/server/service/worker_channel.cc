#include "plexus/server/service/internal/worker_channel.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/common/logging.h"
#include "plexus/server/scheduling/worker_wire.h"

namespace plexus {

WorkerChannel::WorkerChannel(Stream* stream, grpc::ServerContext* ctx,
                             std::string hello, std::string head,
                             int64_t worker_id)
    : stream_(stream),
      ctx_(ctx),
      head_(std::move(head)),
      worker_id_(worker_id),
      hello_(std::move(hello)) {}

bool WorkerChannel::Write(std::vector<OutOp>& ops) {
  absl::MutexLock lock(&write_mu_);
  return ops_ != nullptr ? WriteFrame(ops) : WriteStream(ops, "");
}

bool WorkerChannel::WriteStream(std::vector<OutOp>& ops,
                                const std::string& extra) {
  // One slice, the message's parts written into it once.
  grpc_slice bytes = grpc_slice_malloc(hello_.size() + head_.size() +
                                       extra.size() + OpsSize(ops));
  uint8_t* target = GRPC_SLICE_START_PTR(bytes);
  std::memcpy(target, hello_.data(), hello_.size());
  target += hello_.size();
  std::memcpy(target, head_.data(), head_.size());
  target += head_.size();
  target = WriteOps(ops, target);
  std::memcpy(target, extra.data(), extra.size());
  hello_.clear();
  grpc::Slice slice(bytes, grpc::Slice::STEAL_REF);
  grpc::ByteBuffer buffer(&slice, 1);
  return stream_->Write(buffer);
}

bool WorkerChannel::WriteFrame(std::vector<OutOp>& ops) {
  const size_t size = head_.size() + OpsSize(ops);
  if (size > frame_capacity_) {
    frame_capacity_ = std::max<size_t>(size, 2 * frame_capacity_);
    frame_.reset(new char[frame_capacity_]);
  }
  auto* target = reinterpret_cast<uint8_t*>(frame_.get());
  std::memcpy(target, head_.data(), head_.size());
  WriteOps(ops, target + head_.size());
  if (absl::Status s = ops_->SendOps(absl::string_view(frame_.get(), size));
      !s.ok()) {
    // The worker's session ends as a broken stream's does: its reads end
    // (ServeWorker), then EndWorkerSession.
    bool said;
    {
      absl::MutexLock lock(&conn_mu_);
      said = shut_down_;
    }
    if (!said) {
      SPDLOG_WARN(
          "worker {}: its ops connection broke ({}); ending its session",
          worker_id_, s.ToString());
    }
    ctx_->TryCancel();
    return false;
  }
  // A large write's buffer is not kept for the next (a program's load).
  if (frame_capacity_ > (size_t{1} << 20)) {
    frame_.reset();
    frame_capacity_ = 0;
  }
  return true;
}

bool WorkerChannel::MoveToDataPlane(
    std::unique_ptr<transport::DataPlaneConnection> ops) {
  std::shared_ptr<transport::DataPlaneConnection> conn = std::move(ops);
  absl::MutexLock lock(&write_mu_);
  {
    absl::MutexLock c(&conn_mu_);
    if (shut_down_) return false;
    conn_ = conn;
  }
  proto::ServerToWorker moved;
  moved.set_ops_on_data_plane(true);
  std::vector<OutOp> none;
  if (!WriteStream(none, moved.SerializeAsString())) return false;
  ops_ = conn.get();
  on_data_plane_ = true;
  return true;
}

bool WorkerChannel::WritableNow() {
  if (!on_data_plane_.load(std::memory_order_relaxed)) return false;
  if (!write_mu_.TryLock()) return false;
  const bool writable = ops_ != nullptr && ops_->WritableNow();
  write_mu_.Unlock();
  return writable;
}

int WorkerChannel::DupReportsFd() {
  absl::MutexLock lock(&conn_mu_);
  if (conn_ == nullptr || shut_down_) return -1;
  return ::dup(conn_->socket_fd());
}

void WorkerChannel::Shutdown() {
  std::shared_ptr<transport::DataPlaneConnection> conn;
  {
    absl::MutexLock lock(&conn_mu_);
    shut_down_ = true;
    conn = conn_;
  }
  if (conn != nullptr) conn->Shutdown();
}

}  // namespace plexus
