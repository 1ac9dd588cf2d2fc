// Raw gRPC peers of the server for tests in this folder: a worker and a
// client that send exactly what a test writes (as a hostile or buggy
// process would), so each check is the server's own.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plexus/common/credentials.h"
#include "plexus/common/ids.h"
#include "plexus/common/protocol.h"
#include "plexus/proto/plexus.grpc.pb.h"

namespace plexus {

inline std::string Bytes(const Credential& c) {
  return std::string(reinterpret_cast<const char*>(c.data()), c.size());
}

inline std::unique_ptr<proto::Controller::Stub> Stub(
    const std::string& address) {
  return proto::Controller::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

inline ClusterSecret NewSecret() {
  absl::StatusOr<ClusterSecret> secret = ClusterSecret::Generate();
  EXPECT_TRUE(secret.ok()) << secret.status();
  return *secret;
}

// What a worker op does with buffer `id`: an Execute makes it (an output);
// a task reads it (an input piece); a Release lets it go.
inline bool Makes(const proto::WorkerOp& op, uint64_t id) {
  for (uint64_t b : op.execute().output_ids()) {
    if (b == id) return true;
  }
  return false;
}
inline bool Reads(const proto::WorkerOp& op, uint64_t id) {
  for (const auto& task : op.execute().tasks()) {
    for (const auto& input : task.inputs()) {
      for (const auto& piece : input.pieces()) {
        if (piece.buffer_id() == id) return true;
      }
    }
  }
  return false;
}
inline bool Releases(const proto::WorkerOp& op, uint64_t id) {
  for (uint64_t b : op.release().buffer_ids()) {
    if (b == id) return true;
  }
  return false;
}

// A fake worker: a registration on a raw stream, reading the ops the
// server sends it.
class RawWorker {
 public:
  RawWorker(proto::Controller::Stub& stub, const std::string& credential,
            const std::string& host_name = "rawhost", int devices = 2) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stream_ = stub.WorkerSession(&ctx_);
    proto::WorkerToServer hello;
    auto* reg = hello.mutable_register_();
    reg->set_host_name(host_name);
    reg->set_pid(1);
    for (int d = 0; d < devices; ++d) {
      auto* dev = reg->add_devices();
      dev->set_index(d);
      dev->set_memory_bytes(1 << 20);
    }
    reg->set_credential(credential);
    reg->set_protocol_version(kProtocolVersion);
    stream_->Write(hello);
  }
  ~RawWorker() {
    if (finished_) return;
    ctx_.TryCancel();
    proto::ServerToWorker drain;
    while (stream_->Read(&drain)) {
    }
    stream_->Finish().IgnoreError();
  }
  // The next op; false when the session ended.
  bool NextOp(proto::WorkerOp* op) {
    while (pending_.empty()) {
      proto::ServerToWorker msg;
      if (!stream_->Read(&msg)) return false;
      if (msg.worker_id() != 0) worker_id_ = msg.worker_id();
      for (auto& o : msg.ops()) pending_.push_back(o);
    }
    *op = pending_.front();
    pending_.erase(pending_.begin());
    return true;
  }
  // After a refusal: how the server ended the session.
  grpc::Status Refusal() {
    proto::ServerToWorker msg;
    EXPECT_FALSE(stream_->Read(&msg)) << "the server accepted the worker";
    if (msg.worker_id() != 0) ctx_.TryCancel();
    while (stream_->Read(&msg)) {
    }
    finished_ = true;
    return stream_->Finish();
  }
  int64_t worker_id() {
    proto::WorkerOp op;
    while (worker_id_ == 0 && NextOp(&op)) {
    }
    return worker_id_;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::WorkerToServer, proto::ServerToWorker>>
      stream_;
  std::vector<proto::WorkerOp> pending_;
  int64_t worker_id_ = 0;
  bool finished_ = false;
};

// A raw client session: what a client library would send, or anything else.
class RawClient {
 public:
  RawClient(proto::Controller::Stub& stub, const std::string& name,
            const std::vector<proto::ClientOp>& first_ops,
            const std::string& tenant = "",
            const std::string& tenant_credential = "") {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stream_ = stub.ClientSession(&ctx_);
    proto::ClientToServer hello;
    hello.set_client_name(name);
    hello.set_tenant(tenant);
    hello.set_tenant_credential(tenant_credential);
    hello.set_protocol_version(kProtocolVersion);
    for (const auto& op : first_ops) *hello.add_ops() = op;
    stream_->Write(hello);
  }
  ~RawClient() {
    stream_->WritesDone();
    proto::ServerToClient drain;
    while (stream_->Read(&drain)) {
    }
    stream_->Finish().IgnoreError();
  }
  void Send(const std::vector<proto::ClientOp>& ops) {
    proto::ClientToServer msg;
    for (const auto& op : ops) *msg.add_ops() = op;
    ASSERT_TRUE(stream_->Write(msg));
  }
  // Reads until `done` holds for what was read so far.
  void ReadUntil(const std::function<bool()>& done) {
    proto::ServerToClient msg;
    while (!done() && stream_->Read(&msg)) {
      if (msg.client_id() != 0) id_ = msg.client_id();
      if (!msg.credential().empty()) credential_ = msg.credential();
      for (const auto& s : msg.slices()) slices_.push_back(s);
      for (const auto& e : msg.errors()) errors_.push_back(e);
      for (const auto& r : msg.recoveries()) recoveries_.push_back(r);
    }
  }
  uint64_t Id(uint64_t n) const { return ClientMadeId(id_, n); }

  uint64_t id_ = 0;
  std::string credential_;
  std::vector<proto::SliceReply> slices_;
  std::vector<proto::CallError> errors_;
  std::vector<proto::Recovery> recoveries_;  // notes: losses, resizes

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<proto::ClientToServer, proto::ServerToClient>>
      stream_;
};

}  // namespace plexus
