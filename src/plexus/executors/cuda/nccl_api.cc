#include "plexus/executors/cuda/nccl_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/executors/cuda/internal/dl.h"

#if __has_include(<nccl.h>)
// The toolkit's NCCL is installed (CI, the development machines): check the
// declarations below against its header.
#include <nccl.h>
#define PLEXUS_NCCL_HEADER 1
#endif

namespace plexus::cuda {
namespace {

// NCCL's C ABI, as Plexus uses it.
using Result = int;  // ncclResult_t
constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;
constexpr int kSum = 0;  // ncclRedOp_t
struct UniqueId {        // ncclUniqueId
  char internal[NcclUniqueId::kBytes];
};
// ncclConfig_t as NCCL 2.14 defined it: the fields Plexus sets. NCCL reads
// a config by its size and version, so a newer library takes this one and
// leaves the fields it lacks at their defaults.
struct Config {
  size_t size = sizeof(Config);
  unsigned magic = 0xcafebeef;
  unsigned version = 21400;  // NCCL_VERSION(2, 14, 0)
  int blocking = INT_MIN;    // NCCL_CONFIG_UNDEF_INT: the default
  int cga_cluster_size = INT_MIN;
  int min_ctas = INT_MIN;
  int max_ctas = INT_MIN;
  const char* net_name = nullptr;
};

#ifdef PLEXUS_NCCL_HEADER
static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId));
static_assert(NcclUniqueId::kBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(kSuccess == ncclSuccess && kInProgress == ncclInProgress);
static_assert(kSum == ncclSum);
static_assert(sizeof(NcclComm) == sizeof(ncclComm_t));
static_assert(static_cast<int>(NcclType::kInt8) == ncclInt8);
static_assert(static_cast<int>(NcclType::kUint8) == ncclUint8);
static_assert(static_cast<int>(NcclType::kInt32) == ncclInt32);
static_assert(static_cast<int>(NcclType::kUint32) == ncclUint32);
static_assert(static_cast<int>(NcclType::kInt64) == ncclInt64);
static_assert(static_cast<int>(NcclType::kUint64) == ncclUint64);
static_assert(static_cast<int>(NcclType::kFloat16) == ncclFloat16);
static_assert(static_cast<int>(NcclType::kFloat32) == ncclFloat32);
static_assert(static_cast<int>(NcclType::kFloat64) == ncclFloat64);
static_assert(static_cast<int>(NcclType::kBfloat16) == ncclBfloat16);
// Config is a prefix of the header's ncclConfig_t.
static_assert(offsetof(Config, size) == offsetof(ncclConfig_t, size));
static_assert(offsetof(Config, magic) == offsetof(ncclConfig_t, magic));
static_assert(offsetof(Config, version) == offsetof(ncclConfig_t, version));
static_assert(offsetof(Config, blocking) == offsetof(ncclConfig_t, blocking));
static_assert(offsetof(Config, cga_cluster_size) ==
              offsetof(ncclConfig_t, cgaClusterSize));
static_assert(offsetof(Config, min_ctas) == offsetof(ncclConfig_t, minCTAs));
static_assert(offsetof(Config, max_ctas) == offsetof(ncclConfig_t, maxCTAs));
static_assert(offsetof(Config, net_name) == offsetof(ncclConfig_t, netName));
static_assert(sizeof(Config) <= sizeof(ncclConfig_t));
static_assert(NCCL_CONFIG_UNDEF_INT == INT_MIN);
#endif

}  // namespace

struct NcclApi::Table {
  Result (*GetVersion)(int*);
  Result (*GetUniqueId)(UniqueId*);
  Result (*CommInitRankConfig)(NcclComm*, int, UniqueId, int, Config*);
  Result (*CommGetAsyncError)(NcclComm, Result*);
  Result (*CommAbort)(NcclComm);
  Result (*AllReduce)(const void*, void*, size_t, int, int, NcclComm, Stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  const char* (*GetErrorString)(Result);
  const char* (*GetLastError)(NcclComm);
};

namespace {

using internal::Bind;

absl::Status LoadOnce(const std::vector<std::string>& dirs, NcclApi::Table* t,
                      std::string* path) {
  std::vector<std::string> tried;
  void* lib =
      internal::OpenFirst({"libnccl.so.2", "libnccl.so"}, dirs, path, &tried);
  if (lib == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("NCCL is not available: could not open libnccl (tried ",
                     absl::StrJoin(tried, ", "), ")"));
  }
  for (absl::Status s : {
           Bind(lib, "NCCL", "ncclGetVersion", &t->GetVersion),
           Bind(lib, "NCCL", "ncclGetUniqueId", &t->GetUniqueId),
           Bind(lib, "NCCL", "ncclCommInitRankConfig", &t->CommInitRankConfig),
           Bind(lib, "NCCL", "ncclCommGetAsyncError", &t->CommGetAsyncError),
           Bind(lib, "NCCL", "ncclCommAbort", &t->CommAbort),
           Bind(lib, "NCCL", "ncclAllReduce", &t->AllReduce),
           Bind(lib, "NCCL", "ncclGroupStart", &t->GroupStart),
           Bind(lib, "NCCL", "ncclGroupEnd", &t->GroupEnd),
           Bind(lib, "NCCL", "ncclGetErrorString", &t->GetErrorString),
           Bind(lib, "NCCL", "ncclGetLastError", &t->GetLastError),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<const NcclApi*> NcclApi::Load(
    const std::vector<std::string>& search_dirs) {
  static std::once_flag once;
  static absl::StatusOr<const NcclApi*>* result;
  std::call_once(once, [&] {
    auto* table = new Table{};
    auto* api = new NcclApi();
    absl::Status loaded = LoadOnce(search_dirs, table, &api->path_);
    if (loaded.ok() && table->GetVersion(&api->version_) != kSuccess) {
      loaded = absl::UnavailableError(
          absl::StrCat("NCCL: ncclGetVersion failed in ", api->path_));
    }
    if (loaded.ok()) {
      api->table_ = table;
      result = new absl::StatusOr<const NcclApi*>(api);
    } else {
      result = new absl::StatusOr<const NcclApi*>(loaded);
      delete api;
      delete table;
    }
  });
  return *result;
}

absl::Status NcclApi::Check(Result result, const char* call,
                            NcclComm comm) const {
  if (result == kSuccess || result == kInProgress) return absl::OkStatus();
  const char* what = table_->GetErrorString(result);
  const char* last = table_->GetLastError(comm);
  return absl::UnavailableError(
      absl::StrCat(call, " failed: ", what != nullptr ? what : "unknown error",
                   " (NCCL error ", result, ")",
                   last != nullptr && *last != '\0' ? absl::StrCat(": ", last)
                                                    : std::string()));
}

absl::StatusOr<NcclUniqueId> NcclApi::GetUniqueId() const {
  UniqueId raw;
  std::memset(&raw, 0, sizeof(raw));
  if (absl::Status s =
          Check(table_->GetUniqueId(&raw), "ncclGetUniqueId", nullptr);
      !s.ok()) {
    return s;
  }
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), raw.internal, sizeof(raw.internal));
  return id;
}

absl::StatusOr<NcclComm> NcclApi::StartInit(int nranks, const NcclUniqueId& id,
                                            int rank) const {
  UniqueId raw;
  std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
  Config config;
  config.blocking = 0;
  NcclComm comm = nullptr;
  absl::Status s =
      Check(table_->CommInitRankConfig(&comm, nranks, raw, rank, &config),
            "ncclCommInitRankConfig", nullptr);
  if (!s.ok()) {
    if (comm != nullptr) Abort(comm);
    return s;
  }
  return comm;
}

absl::Status NcclApi::Wait(NcclComm comm, Clock& clock, absl::Time deadline,
                           const GiveUpFn& give_up,
                           const FinishedFn& finished) const {
  // NCCL's own threads make progress; this one only looks. The first looks
  // come quickly (most collectives are short), then at most every 1 ms.
  absl::Duration poll = absl::Microseconds(20);
  for (;;) {
    Result state = kSuccess;
    absl::Status s = Check(table_->CommGetAsyncError(comm, &state),
                           "ncclCommGetAsyncError", comm);
    if (s.ok()) s = Check(state, "NCCL", comm);
    bool done = state == kSuccess;
    if (s.ok() && done && finished) {
      absl::StatusOr<bool> f = finished();
      if (!f.ok()) s = f.status();
      done = f.ok() && *f;
    }
    if (s.ok() && done) return absl::OkStatus();
    if (s.ok() && clock.Now() >= deadline) {
      s = absl::DeadlineExceededError(
          "NCCL: a communicator made no progress before its deadline (a peer "
          "may be stuck or gone)");
    }
    if (s.ok() && give_up) {
      s = give_up(poll);
    } else if (s.ok()) {
      clock.SleepFor(poll);
    }
    if (!s.ok()) {
      Abort(comm);
      return s;
    }
    poll = std::min(poll * 2, absl::Milliseconds(1));
  }
}

absl::Status NcclApi::AllReduceSum(const void* in, void* out, size_t count,
                                   NcclType type, NcclComm comm,
                                   Stream stream) const {
  return Check(table_->AllReduce(in, out, count, static_cast<int>(type), kSum,
                                 comm, stream),
               "ncclAllReduce", comm);
}

absl::Status NcclApi::GroupStart() const {
  return Check(table_->GroupStart(), "ncclGroupStart", nullptr);
}

absl::Status NcclApi::GroupEnd() const {
  return Check(table_->GroupEnd(), "ncclGroupEnd", nullptr);
}

void NcclApi::Abort(NcclComm comm) const {
  if (comm != nullptr) table_->CommAbort(comm);
}

}  // namespace plexus::cuda
