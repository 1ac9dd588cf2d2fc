// NcclApi: the NCCL calls Plexus makes to all-reduce device buffers
// between processes (worker/nccl_collective.h uses it). Like CudaApi, the
// library (libnccl.so.2: the CUDA toolkit's, or the nvidia-nccl wheel's
// beside a PJRT plugin) is dlopen()ed at run time, so a build links no NCCL
// and runs where there is none: Load then fails, and all_reduce takes the
// host path. The declarations are Plexus's own; nccl_api.cc checks them
// against nccl.h where it is installed at build time.
//
// Communicators are made nonblocking (ncclCommInitRankConfig with
// blocking = 0), so no call here waits inside NCCL for a peer that may be
// dead: Wait polls the communicator's state until it is done, its deadline
// passes or the caller gives up, and then aborts it (ncclCommAbort), which
// ends what it was doing.
//
//   StartInit ──Wait OK──▶ ready ──AllReduce, Wait OK──▶ ready ...
//       │                    │
//       └── Wait fails ──────┴── Wait fails / peer down ──▶ Abort (gone)
//
// Thread-safe: the loaded table is immutable; one communicator is used by
// one thread at a time (NCCL's rule).
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/common/clock.h"
#include "plexus/executors/cuda/cuda_api.h"

namespace plexus::cuda {

// The bootstrap address rank 0 makes and every rank of a communicator
// needs (ncclUniqueId: 128 opaque bytes).
struct NcclUniqueId {
  static constexpr size_t kBytes = 128;
  std::array<char, kBytes> bytes{};
};

// An opaque communicator (ncclComm_t).
using NcclComm = void*;

// The element types NCCL sums (ncclDataType_t values).
enum class NcclType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};

class NcclApi {
 public:
  // libnccl.so.2 (or unversioned), opened once per process: by soname
  // first, then in `search_dirs` (CudaApi::LibraryDirsBeside gives a
  // plugin wheel's). Later calls return the first result whatever their
  // dirs. An error names every file tried.
  static absl::StatusOr<const NcclApi*> Load(
      const std::vector<std::string>& search_dirs = {});

  // ncclGetVersion: major * 10000 + minor * 100 + patch (22809).
  int version() const { return version_; }
  const std::string& path() const { return path_; }

  // A fresh unique id (rank 0 of a new communicator makes it; it opens
  // the bootstrap's listening socket).
  absl::StatusOr<NcclUniqueId> GetUniqueId() const;

  // Starts making this process's rank `rank` of `nranks` on the calling
  // thread's current GPU (CudaApi::MakeCurrent), nonblocking: Wait for it
  // before use.
  absl::StatusOr<NcclComm> StartInit(int nranks, const NcclUniqueId& id,
                                     int rank) const;

  // Polls `comm` until what was started on it (StartInit, AllReduceSum,
  // GroupEnd) is no longer in progress and `finished` (where given: e.g.
  // the stream has run it) says so. Returns early with an error where the
  // deadline passes, `give_up` returns a non-OK status (it is called
  // between polls and may block up to `poll` waiting for a reason: a peer's
  // death), `finished` fails, or NCCL reports an error; `comm` is aborted
  // then and must not be used again. The deadline is on `clock`, which
  // also paces the polls when there is no `give_up`.
  using GiveUpFn = std::function<absl::Status(absl::Duration poll)>;
  using FinishedFn = std::function<absl::StatusOr<bool>()>;
  absl::Status Wait(NcclComm comm, Clock& clock, absl::Time deadline,
                    const GiveUpFn& give_up,
                    const FinishedFn& finished = nullptr) const;

  // Queues out = sum over ranks of `in` (count elements of `type`) on
  // `stream`; in == out is allowed.
  absl::Status AllReduceSum(const void* in, void* out, size_t count,
                            NcclType type, NcclComm comm, Stream stream) const;
  // Brackets several AllReduceSum calls (one per local GPU) into one.
  absl::Status GroupStart() const;
  absl::Status GroupEnd() const;

  // Ends `comm` and whatever it is doing (never waits for peers).
  void Abort(NcclComm comm) const;

  struct Table;  // the function pointers (nccl_api.cc)

 private:
  NcclApi() = default;
  // The error of `result`, naming `call` and NCCL's last message.
  absl::Status Check(int result, const char* call, NcclComm comm) const;
  const Table* table_ = nullptr;
  int version_ = 0;
  std::string path_;
};

}  // namespace plexus::cuda
