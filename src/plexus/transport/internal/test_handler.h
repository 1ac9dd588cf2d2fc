// Test scaffolding for data-plane tests: a handler that stands in for the
// worker's object store, and helpers to make and compare shard bytes.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "plexus/store/storage.h"
#include "plexus/transport/data_plane.h"

namespace plexus::transport::test_support {

// How long a test waits for a condition before it fails.
inline constexpr absl::Duration kDeadline = absl::Seconds(20);

// An object store reduced to a map of ready shards (and failed ones).
class MapHandler : public DataPlaneHandler {
 public:
  // Every peer must prove `required_` (all zero until RequireCredential);
  // a connection that does may make every request.
  absl::StatusOr<Credential> CredentialFor(const DataPlanePeer&) override {
    absl::MutexLock lock(&mu_);
    return required_;
  }
  absl::Status Authorize(DataPlaneRequest, const ShardKey&,
                         const DataPlanePeer&) override {
    return absl::OkStatus();
  }
  void RequireCredential(const Credential& credential) {
    absl::MutexLock lock(&mu_);
    required_ = credential;
  }
  absl::Status AdmitIncoming(const ShardKey&, size_t bytes, bool) override {
    absl::MutexLock lock(&mu_);
    ++admissions_;
    if (bytes > admit_limit_) {
      return absl::InvalidArgumentError(
          absl::StrCat(bytes, " bytes is more than the ", admit_limit_,
                       " bytes this handler admits"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<Storage>> AllocateIncoming(const ShardKey&,
                                                            size_t bytes,
                                                            bool) override {
    absl::MutexLock lock(&mu_);
    ++allocations_;
    if (!no_room_.ok()) return no_room_;
    return Storage::Allocate(bytes);
  }
  absl::Status Deliver(const ShardKey& key, std::shared_ptr<Storage> data,
                       bool) override {
    absl::MutexLock lock(&mu_);
    if (!reject_.ok()) return reject_;
    ready_[key] = std::move(data);
    cv_.SignalAll();
    return absl::OkStatus();
  }
  void DeliverError(const ShardKey& key, const absl::Status& error) override {
    Fail(key, error);
  }
  absl::StatusOr<std::shared_ptr<const Storage>> AwaitReady(
      const ShardKey& key) override {
    absl::MutexLock lock(&mu_);
    ++waiters_;
    cv_.SignalAll();
    while (!ready_.contains(key) && !errors_.contains(key) && !closed_) {
      cv_.Wait(&mu_);
    }
    --waiters_;
    if (closed_) return absl::CancelledError("handler closed");
    if (errors_.contains(key)) return errors_[key];
    return std::shared_ptr<const Storage>(ready_[key]);
  }

  // OPS: recorded in order with their generation; a message "fail" is
  // refused (the connection closes).
  absl::Status ApplyOps(const DataPlanePeer&, uint64_t generation,
                        std::string& message) override {
    absl::MutexLock lock(&mu_);
    ops_.push_back(absl::StrCat(generation, ":", message));
    cv_.SignalAll();
    if (message == "fail") return absl::InvalidArgumentError("told to fail");
    return absl::OkStatus();
  }
  void OpsEnded(const DataPlanePeer&, uint64_t generation,
                const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    ops_ended_.push_back(absl::StrCat(generation, ":", why.ToString()));
    cv_.SignalAll();
  }
  // The ops applied ("generation:message"), once there are `n`; and the
  // ends said, once there are `ends` (else what there is at the deadline).
  std::vector<std::string> WaitForOps(size_t n, size_t ends,
                                      std::vector<std::string>* ended) {
    absl::MutexLock lock(&mu_);
    absl::Time deadline = absl::Now() + kDeadline;
    while (ops_.size() < n || ops_ended_.size() < ends) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    *ended = ops_ended_;
    return ops_;
  }

  // FETCH_EXECUTABLE: what ServeExecutable put there, else NotFound.
  absl::StatusOr<std::shared_ptr<const Storage>> SerializedExecutable(
      uint64_t fingerprint) override {
    absl::MutexLock lock(&mu_);
    auto it = executables_.find(fingerprint);
    if (it == executables_.end()) {
      return absl::NotFoundError(absl::StrCat("no executable ", fingerprint));
    }
    return std::shared_ptr<const Storage>(it->second);
  }
  void ServeExecutable(uint64_t fingerprint, std::shared_ptr<Storage> bytes) {
    absl::MutexLock lock(&mu_);
    executables_[fingerprint] = std::move(bytes);
  }

  void Fail(const ShardKey& key, absl::Status error) {
    absl::MutexLock lock(&mu_);
    errors_[key] = std::move(error);
    cv_.SignalAll();
  }
  void RejectDeliveries(absl::Status error) {
    absl::MutexLock lock(&mu_);
    reject_ = std::move(error);
  }
  void LimitAdmissions(size_t bytes) {
    absl::MutexLock lock(&mu_);
    admit_limit_ = bytes;
  }
  int admissions() {
    absl::MutexLock lock(&mu_);
    return admissions_;
  }
  void RejectAllocations(absl::Status error) {
    absl::MutexLock lock(&mu_);
    no_room_ = std::move(error);
  }
  void Close() {  // releases every AwaitReady caller
    absl::MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
  }
  // The shard once delivered (or its error); null on timeout.
  std::shared_ptr<Storage> WaitFor(const ShardKey& key, absl::Status* error) {
    absl::MutexLock lock(&mu_);
    absl::Time deadline = absl::Now() + kDeadline;
    while (!ready_.contains(key) && !errors_.contains(key)) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return nullptr;
    }
    if (errors_.contains(key)) *error = errors_[key];
    return ready_.contains(key) ? ready_[key] : nullptr;
  }
  bool WaitForWaiters(int n) {
    absl::MutexLock lock(&mu_);
    absl::Time deadline = absl::Now() + kDeadline;
    while (waiters_ < n) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return false;
    }
    return true;
  }
  int allocations() {
    absl::MutexLock lock(&mu_);
    return allocations_;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;
  absl::flat_hash_map<ShardKey, std::shared_ptr<Storage>> ready_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ShardKey, absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Storage>> executables_
      ABSL_GUARDED_BY(mu_);
  absl::Status reject_ ABSL_GUARDED_BY(mu_);
  absl::Status no_room_ ABSL_GUARDED_BY(mu_);
  int allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int admissions_ ABSL_GUARDED_BY(mu_) = 0;
  Credential required_ ABSL_GUARDED_BY(mu_) = {};
  size_t admit_limit_ ABSL_GUARDED_BY(mu_) = ~size_t{0};
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> ops_ended_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// `bytes` of a pattern that depends on `seed`; memfd-backed from
// Storage::kShmThreshold up, like any Storage.
inline std::shared_ptr<Storage> Pattern(size_t bytes, int seed) {
  std::shared_ptr<Storage> s = *Storage::Allocate(bytes);
  auto* p = static_cast<unsigned char*>(s->data());
  for (size_t i = 0; i < bytes; ++i) {
    p[i] = static_cast<unsigned char>(i * 131 + seed);
  }
  return s;
}

// `n` bytes of `byte`.
inline std::shared_ptr<const Storage> Valued(size_t n, char byte) {
  std::shared_ptr<Storage> s = *Storage::Allocate(n);
  std::memset(s->data(), byte, n);
  return s;
}

inline bool SameBytes(const Storage& a, const Storage& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// A credential of `byte` repeated.
inline Credential Filled(uint8_t byte) {
  Credential c;
  c.fill(byte);
  return c;
}

// The identity of client `id` holding `credential`.
inline DataPlaneIdentity Client(uint64_t id, const Credential& credential) {
  DataPlaneIdentity me;
  me.peer = {CredentialRole::kClient, id};
  me.credential = credential;
  return me;
}

// An abstract socket name no other test (or test process) uses.
inline std::string UniqueUnixName() {
  static std::atomic<int> counter{0};
  return absl::StrCat("plexus-dp-test-", getpid(), "-", counter++);
}

}  // namespace plexus::transport::test_support
