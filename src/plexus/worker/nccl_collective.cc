#include "plexus/worker/nccl_collective.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "plexus/executors/xla/pjrt_runtime.h"

namespace plexus {
namespace {

// Offer wire layout (RankOffer::kBytes, little-endian as the hosts are):
//   0  u32 magic      4 u32 flags (1: on_gpu, 2: has_unique_id)
//   8  char gpu[32]  40 u64 communicator fingerprint
//  48  char unique_id[128]
constexpr uint32_t kOfferMagic = 0x4e43434c;  // "NCCL"
constexpr size_t kGpuBytes = 32;
static_assert(RankOffer::kBytes == 48 + cuda::NcclUniqueId::kBytes);

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string RankOffer::Encode() const {
  std::string out(kBytes, '\0');
  const uint32_t flags = (on_gpu ? 1u : 0u) | (has_unique_id ? 2u : 0u);
  std::memcpy(&out[0], &kOfferMagic, 4);
  std::memcpy(&out[4], &flags, 4);
  std::memcpy(&out[8], gpu.data(), std::min(gpu.size(), kGpuBytes));
  std::memcpy(&out[40], &communicator, 8);
  std::memcpy(&out[48], unique_id.bytes.data(), cuda::NcclUniqueId::kBytes);
  return out;
}

absl::StatusOr<RankOffer> RankOffer::Decode(absl::string_view bytes) {
  uint32_t magic = 0, flags = 0;
  if (bytes.size() != kBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an all_reduce offer of ", bytes.size(), " bytes, not ", kBytes));
  }
  std::memcpy(&magic, bytes.data(), 4);
  std::memcpy(&flags, bytes.data() + 4, 4);
  if (magic != kOfferMagic || (flags & ~3u) != 0) {
    return absl::InvalidArgumentError("not an all_reduce offer");
  }
  RankOffer offer;
  offer.on_gpu = flags & 1u;
  offer.has_unique_id = flags & 2u;
  offer.gpu.assign(bytes.data() + 8, kGpuBytes);
  offer.gpu.resize(strnlen(offer.gpu.data(), kGpuBytes));
  std::memcpy(&offer.communicator, bytes.data() + 40, 8);
  std::memcpy(offer.unique_id.bytes.data(), bytes.data() + 48,
              cuda::NcclUniqueId::kBytes);
  return offer;
}

uint64_t CommunicatorFingerprint(const std::vector<int64_t>& workers,
                                 const std::vector<RankOffer>& offers) {
  uint64_t h = 14695981039346656037ull;
  for (size_t r = 0; r < workers.size() && r < offers.size(); ++r) {
    h = Fnv1a(h, &workers[r], sizeof(workers[r]));
    h = Fnv1a(h, offers[r].gpu.data(), offers[r].gpu.size());
    h = Fnv1a(h, "/", 1);
  }
  return h == 0 ? 1 : h;  // 0 means "none"
}

PathChoice ChoosePath(const std::vector<int64_t>& workers,
                      const std::vector<RankOffer>& offers) {
  PathChoice choice;
  if (offers.size() < 2 || offers.size() != workers.size()) {
    choice.reason = "NCCL needs two ranks or more";
    return choice;
  }
  std::map<std::string, size_t> rank_of_gpu;
  for (size_t r = 0; r < offers.size(); ++r) {
    const RankOffer& o = offers[r];
    if (!o.on_gpu || o.gpu.empty()) {
      choice.reason = absl::StrCat("rank ", r, " (worker ", workers[r],
                                   ") holds no value on a CUDA GPU");
      return choice;
    }
    auto [it, fresh] = rank_of_gpu.emplace(o.gpu, r);
    if (!fresh) {
      // NCCL would refuse it (or hang): one GPU, two ranks.
      choice.reason = absl::StrCat(
          "ranks ", it->second, " (worker ", workers[it->second], ") and ", r,
          " (worker ", workers[r], ") are on one GPU (", o.gpu,
          "); NCCL needs a GPU per rank");
      return choice;
    }
  }
  const uint64_t fingerprint = CommunicatorFingerprint(workers, offers);
  bool all_have = true;
  for (const RankOffer& o : offers) all_have &= o.communicator == fingerprint;
  if (!all_have && !offers[0].has_unique_id) {
    choice.reason = "rank 0 has no NCCL unique id for a new communicator";
    return choice;
  }
  choice.nccl = true;
  choice.new_communicator = !all_have;
  return choice;
}

absl::StatusOr<cuda::NcclType> NcclTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return cuda::NcclType::kFloat32;
    case DType::kF64:
      return cuda::NcclType::kFloat64;
    case DType::kF16:
      return cuda::NcclType::kFloat16;
    case DType::kBF16:
      return cuda::NcclType::kBfloat16;
    case DType::kI32:
      return cuda::NcclType::kInt32;
    case DType::kI64:
      return cuda::NcclType::kInt64;
    case DType::kU32:
      return cuda::NcclType::kUint32;
    case DType::kU64:
      return cuda::NcclType::kUint64;
    case DType::kI8:
      return cuda::NcclType::kInt8;
    case DType::kU8:
      return cuda::NcclType::kUint8;
    default:
      return absl::NotFoundError(
          absl::StrCat("NCCL does not sum ", DTypeName(dtype)));
  }
}

absl::StatusOr<std::unique_ptr<NcclRuntime>> NcclRuntime::Load(
    const std::vector<std::string>& search_dirs, Clock* clock) {
  absl::StatusOr<const cuda::CudaApi*> cuda = cuda::CudaApi::Load(search_dirs);
  if (!cuda.ok()) return cuda.status();
  absl::StatusOr<const cuda::NcclApi*> nccl = cuda::NcclApi::Load(search_dirs);
  if (!nccl.ok()) return nccl.status();
  absl::StatusOr<int> gpus = (*cuda)->DeviceCount();
  if (!gpus.ok()) return gpus.status();
  if (*gpus < 1) return absl::UnavailableError("NCCL: no GPU is visible");
  return std::unique_ptr<NcclRuntime>(new NcclRuntime(*cuda, *nccl, clock));
}

NcclRuntime::~NcclRuntime() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, c] : communicators_) Destroy(c);
}

void NcclRuntime::Destroy(Communicator& c) {
  nccl_->Abort(c.comm);
  if (c.stream != nullptr) {
    cuda_->DestroyStream(c.ordinal, c.stream).IgnoreError();
  }
  c = Communicator{};
}

RankOffer NcclRuntime::Offer(const std::vector<int64_t>& workers, int my_rank,
                             const Storage& in, const TensorSpec& spec) {
  RankOffer offer;
  const auto* buffer = dynamic_cast<const xla::PjrtBuffer*>(in.device_buffer());
  if (in.kind() != MemoryKind::kDevice || buffer == nullptr) {
    offer.why_not = "a value in host memory";
    return offer;
  }
  if (absl::StatusOr<cuda::NcclType> t = NcclTypeOf(spec.dtype); !t.ok()) {
    offer.why_not = std::string(t.status().message());
    return offer;
  }
  absl::StatusOr<xla::PjrtBuffer::GpuMemory> gpu = buffer->Gpu();
  if (!gpu.ok()) {
    offer.why_not = std::string(gpu.status().message());
    return offer;
  }
  absl::MutexLock lock(&mu_);
  auto uuid = uuids_.find(gpu->ordinal);
  if (uuid == uuids_.end()) {
    absl::StatusOr<std::string> got = cuda_->DeviceUuid(gpu->ordinal);
    if (!got.ok()) {
      offer.why_not = std::string(got.status().message());
      return offer;
    }
    uuid = uuids_.emplace(gpu->ordinal, *got).first;
  }
  offer.on_gpu = true;
  offer.gpu = uuid->second;
  const Key key{workers, offer.gpu};
  if (auto c = communicators_.find(key); c != communicators_.end()) {
    offer.communicator = c->second.fingerprint;
  }
  if (my_rank == 0) {
    auto id = unused_ids_.find(key);
    if (id == unused_ids_.end()) {
      absl::StatusOr<cuda::NcclUniqueId> made = nccl_->GetUniqueId();
      if (made.ok()) id = unused_ids_.emplace(key, *made).first;
    }
    if (id != unused_ids_.end()) {
      offer.has_unique_id = true;
      offer.unique_id = id->second;
    }
  }
  return offer;
}

absl::StatusOr<std::shared_ptr<Storage>> NcclRuntime::AllReduce(
    const std::vector<int64_t>& workers, int my_rank,
    const std::vector<RankOffer>& offers, const PathChoice& choice,
    const Storage& in, const TensorSpec& spec, absl::Time deadline,
    const cuda::NcclApi::GiveUpFn& give_up, const std::string& what) {
  const auto* buffer = dynamic_cast<const xla::PjrtBuffer*>(in.device_buffer());
  absl::StatusOr<cuda::NcclType> type = NcclTypeOf(spec.dtype);
  if (buffer == nullptr || !type.ok() || !choice.nccl) {
    return absl::InternalError(absl::StrCat(
        what, ": the NCCL path chosen for a shard it cannot take"));
  }
  absl::StatusOr<xla::PjrtBuffer::GpuMemory> src = buffer->Gpu();
  if (!src.ok()) return src.status();
  const Key key{workers, offers[my_rank].gpu};
  const int nranks = static_cast<int>(workers.size());
  // Checked out while in use: a peer's death meanwhile ends the waits
  // below (give_up), not DropWorker.
  Communicator c;
  {
    absl::MutexLock lock(&mu_);
    auto it = communicators_.find(key);
    if (it != communicators_.end()) {
      c = it->second;
      communicators_.erase(it);
    }
    if (my_rank == 0 && choice.new_communicator) unused_ids_.erase(key);
  }
  auto fail = [&](absl::Status s) {
    Destroy(c);
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  };
  if (choice.new_communicator) {
    Destroy(c);
    c.ordinal = src->ordinal;
    if (absl::Status s = cuda_->MakeCurrent(c.ordinal); !s.ok()) return fail(s);
    absl::StatusOr<cuda::NcclComm> comm =
        nccl_->StartInit(nranks, offers[0].unique_id, my_rank);
    if (!comm.ok()) return fail(comm.status());
    c.comm = *comm;
    if (absl::Status s = nccl_->Wait(c.comm, *clock_, deadline, give_up);
        !s.ok()) {
      c.comm = nullptr;  // aborted by Wait
      return fail(s);
    }
    absl::StatusOr<cuda::Stream> stream = cuda_->CreateStream(c.ordinal);
    if (!stream.ok()) return fail(stream.status());
    c.stream = *stream;
    c.fingerprint = CommunicatorFingerprint(workers, offers);
  }
  if (c.comm == nullptr || c.ordinal != src->ordinal) {
    return fail(absl::InternalError("no communicator to reuse"));
  }
  absl::StatusOr<std::shared_ptr<xla::PjrtBuffer>> out =
      buffer->NewOnSameDevice(spec, what);
  if (!out.ok()) return fail(out.status());
  absl::StatusOr<xla::PjrtBuffer::GpuMemory> dst = (*out)->Gpu();
  if (!dst.ok()) return fail(dst.status());
  if (absl::Status s = cuda_->MakeCurrent(c.ordinal); !s.ok()) return fail(s);
  if (absl::Status s = nccl_->AllReduceSum(
          src->address, dst->address, static_cast<size_t>(spec.num_elements()),
          *type, c.comm, c.stream);
      !s.ok()) {
    return fail(s);
  }
  const int ordinal = c.ordinal;
  const cuda::Stream stream = c.stream;
  if (absl::Status s =
          nccl_->Wait(c.comm, *clock_, deadline, give_up,
                      [&]() { return cuda_->StreamDone(ordinal, stream); });
      !s.ok()) {
    c.comm = nullptr;  // aborted by Wait
    return fail(s);
  }
  NcclPaths::all_reduce()++;
  TransferBytes::Add(TransferBytes::kNccl, spec.byte_size());
  {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = communicators_.emplace(key, c);
    if (!fresh) {  // cannot happen: the server orders calls per island
      Destroy(it->second);
      it->second = c;
    }
  }
  return Storage::OnDevice(
      std::shared_ptr<const DeviceBuffer>(*std::move(out)));
}

void NcclRuntime::DropWorker(int64_t worker_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = communicators_.begin(); it != communicators_.end();) {
    const std::vector<int64_t>& workers = it->first.first;
    if (std::find(workers.begin(), workers.end(), worker_id) != workers.end()) {
      Destroy(it->second);
      it = communicators_.erase(it);
    } else {
      ++it;
    }
  }
}

RankOffer OffersWithoutGpu::Offer(const std::vector<int64_t>&, int my_rank,
                                  const Storage&, const TensorSpec&) {
  RankOffer offer;
  offer.why_not = "no GPU (offers only: nccl_offers_without_gpu)";
  if (my_rank == 0) {
    absl::StatusOr<const cuda::NcclApi*> nccl = cuda::NcclApi::Load();
    absl::StatusOr<cuda::NcclUniqueId> id =
        nccl.ok() ? (*nccl)->GetUniqueId() : nccl.status();
    if (id.ok()) {
      offer.has_unique_id = true;
      offer.unique_id = *id;
    }
  }
  return offer;
}

absl::StatusOr<std::shared_ptr<Storage>> OffersWithoutGpu::AllReduce(
    const std::vector<int64_t>&, int, const std::vector<RankOffer>&,
    const PathChoice&, const Storage&, const TensorSpec&, absl::Time,
    const cuda::NcclApi::GiveUpFn&, const std::string& what) {
  return absl::InternalError(
      absl::StrCat(what, ": NCCL chosen where no offer is on a GPU"));
}

}  // namespace plexus
