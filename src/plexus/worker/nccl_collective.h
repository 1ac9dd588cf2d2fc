// The NCCL path of all_reduce between GPU islands: where every worker of a
// call runs NCCL (RegisterWorker.nccl, passed on in CollectivePeer.nccl)
// and holds one local shard, the ranks first trade offers over the data
// plane (under the call's exchange key, as partials travel), then all
// choose the same path from the same offers:
//
//   every rank's shard is a device value on a CUDA GPU, no GPU holds two
//   ranks, NCCL sums the dtype ─▶ ncclAllReduce on the GPUs (device output)
//   anything else ────────────────▶ the host path (collective.h), unchanged
//
// A communicator per (ordered workers of the call, this worker's GPU) is
// made on first use (rank 0's unique id travels in its offer) and cached;
// all ranks reuse it only where every offer names the communicator that
// the offers describe (its fingerprint), so a rank that lost one makes the
// rest make a new one with it. The server orders collectives per island,
// so every rank makes and uses communicators in one order.
//
// First version, unverified on hardware (NCCL refuses two ranks on one GPU
// and the machine this project borrows has one): the input is awaited on
// the host before ncclAllReduce is queued, and the NCCL stream is awaited
// (polled) before the output enters the store; a call with more than one
// local shard on a worker takes the host path.
//
// Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/common/types.h"
#include "plexus/executors/cuda/cuda_api.h"
#include "plexus/executors/cuda/nccl_api.h"
#include "plexus/store/storage.h"

namespace plexus {

// All-reduces this process ran on GPUs with NCCL, one per shard
// (WorkerStats.transfers_nccl, beside store/device_buffer.h's
// TransferPaths).
struct NcclPaths {
  static std::atomic<int64_t>& all_reduce() {
    static std::atomic<int64_t> n{0};
    return n;
  }
};

// What one rank says about its shard of an all_reduce before the ranks
// choose a path. Fixed size on the wire (kBytes): the data plane admits a
// key's declared size only.
struct RankOffer {
  static constexpr size_t kBytes = 4 + 4 + 32 + 8 + cuda::NcclUniqueId::kBytes;
  // Its shard is a dense device value on a CUDA GPU, of a dtype NCCL sums.
  bool on_gpu = false;
  std::string why_not;  // when !on_gpu: why (not sent)
  std::string gpu;      // the GPU's UUID (32 hex digits)
  // Of the communicator it holds for these workers on this GPU (0: none).
  uint64_t communicator = 0;
  // Rank 0's: the unique id of a new communicator, where it has one.
  bool has_unique_id = false;
  cuda::NcclUniqueId unique_id;

  std::string Encode() const;
  static absl::StatusOr<RankOffer> Decode(absl::string_view bytes);
};

// The fingerprint of the communicator that `offers` (rank order) describe:
// the workers and each rank's GPU.
uint64_t CommunicatorFingerprint(const std::vector<int64_t>& workers,
                                 const std::vector<RankOffer>& offers);

struct PathChoice {
  bool nccl = false;
  // nccl: whether the ranks make a new communicator (else reuse theirs).
  bool new_communicator = false;
  std::string reason;  // why the host path (for logs and tests)
};
// The same on every rank given the same offers. `workers` name the ranks.
PathChoice ChoosePath(const std::vector<int64_t>& workers,
                      const std::vector<RankOffer>& offers);

// The NCCL dtype of `dtype`, or NotFound where NCCL does not sum it.
absl::StatusOr<cuda::NcclType> NcclTypeOf(DType dtype);

// What CallCollective asks of the GPUs (NcclRuntime; a test may give its
// own, to drive the offers without a GPU).
class CollectiveGpus {
 public:
  virtual ~CollectiveGpus() = default;
  // This rank's offer for its shard `in` of `spec`, in a call over
  // `workers` (rank order) where it is rank `my_rank`.
  virtual RankOffer Offer(const std::vector<int64_t>& workers, int my_rank,
                          const Storage& in, const TensorSpec& spec) = 0;
  // Sums `in` over the ranks on the GPUs as `choice` (nccl) says. Waits at
  // most until `deadline`, and gives up where `give_up` says
  // (NcclApi::Wait). `what` names the call in errors.
  virtual absl::StatusOr<std::shared_ptr<Storage>> AllReduce(
      const std::vector<int64_t>& workers, int my_rank,
      const std::vector<RankOffer>& offers, const PathChoice& choice,
      const Storage& in, const TensorSpec& spec, absl::Time deadline,
      const cuda::NcclApi::GiveUpFn& give_up, const std::string& what) = 0;
  // A peer is down: what it was part of is dropped.
  virtual void DropWorker(int64_t worker_id) {}
};

// For tests on machines without a GPU (WorkerOptions::
// nccl_offers_without_gpu): trades offers as a worker running NCCL does,
// rank 0's with a unique id from NCCL where it loads, but never says a
// value is on a GPU, so every all_reduce takes the host path after the
// offers. So the offers' exchange between real worker processes is
// checked where no GPU is.
class OffersWithoutGpu final : public CollectiveGpus {
 public:
  RankOffer Offer(const std::vector<int64_t>& workers, int my_rank,
                  const Storage& in, const TensorSpec& spec) override;
  absl::StatusOr<std::shared_ptr<Storage>> AllReduce(
      const std::vector<int64_t>& workers, int my_rank,
      const std::vector<RankOffer>& offers, const PathChoice& choice,
      const Storage& in, const TensorSpec& spec, absl::Time deadline,
      const cuda::NcclApi::GiveUpFn& give_up, const std::string& what) override;
};

// The libraries and this worker's communicators.
class NcclRuntime final : public CollectiveGpus {
 public:
  // Loads CUDA and NCCL (in `search_dirs` after the sonames: a plugin
  // wheel's, CudaApi::LibraryDirsBeside) and checks a GPU is visible.
  // NCCL's waits keep their deadlines on `clock`.
  static absl::StatusOr<std::unique_ptr<NcclRuntime>> Load(
      const std::vector<std::string>& search_dirs,
      Clock* clock = Clock::Real());
  ~NcclRuntime();

  // A device value is awaited (its GPU address is known only then); rank
  // 0 puts in a unique id for a new communicator.
  RankOffer Offer(const std::vector<int64_t>& workers, int my_rank,
                  const Storage& in, const TensorSpec& spec) override;
  // Into a new device buffer on in's GPU; a communicator whose wait fails
  // or gives up is aborted and dropped.
  absl::StatusOr<std::shared_ptr<Storage>> AllReduce(
      const std::vector<int64_t>& workers, int my_rank,
      const std::vector<RankOffer>& offers, const PathChoice& choice,
      const Storage& in, const TensorSpec& spec, absl::Time deadline,
      const cuda::NcclApi::GiveUpFn& give_up, const std::string& what) override;

  // A peer is down: aborts and drops every communicator it is part of.
  void DropWorker(int64_t worker_id) override;

 private:
  struct Communicator {
    uint64_t fingerprint = 0;
    cuda::NcclComm comm = nullptr;
    cuda::Stream stream = nullptr;
    int ordinal = -1;
  };
  using Key = std::pair<std::vector<int64_t>, std::string>;  // workers, GPU
  NcclRuntime(const cuda::CudaApi* cuda, const cuda::NcclApi* nccl,
              Clock* clock)
      : cuda_(cuda), nccl_(nccl), clock_(clock) {}
  void Destroy(Communicator& c);  // aborts it: never waits for peers

  const cuda::CudaApi* const cuda_;
  const cuda::NcclApi* const nccl_;
  Clock* const clock_;  // NcclApi::Wait's deadlines and polls
  absl::Mutex mu_;
  std::map<int, std::string> uuids_ ABSL_GUARDED_BY(mu_);  // by ordinal
  std::map<Key, Communicator> communicators_ ABSL_GUARDED_BY(mu_);
  // Rank 0's unique ids not yet used, reused until a communicator is made
  // with one (each holds a bootstrap socket open in NCCL).
  std::map<Key, cuda::NcclUniqueId> unused_ids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace plexus
