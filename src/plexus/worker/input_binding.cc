#include "plexus/worker/input_binding.h"

#include "absl/strings/str_cat.h"

namespace plexus {

absl::StatusOr<builtin::ConstTensor> BindInput(
    ObjectStore& store, const proto::InputBinding& binding, int device,
    std::vector<std::shared_ptr<const Storage>>* keep, int64_t* reserved_bytes,
    const DeviceBuffer** in_device, int64_t* reserved_ahead) {
  auto local = FromProto(binding.local());
  if (!local.ok()) return local.status();
  std::vector<std::shared_ptr<const Storage>> sources;
  for (const auto& piece : binding.pieces()) {
    auto data = store.AwaitInput({piece.buffer_id(), piece.shard()});
    if (!data.ok()) return data.status();
    sources.push_back(*data);
  }
  const size_t bytes = local->byte_size();
  if (binding.pieces_size() == 1 && sources[0]->size() == bytes &&
      binding.pieces(0).dst_offset() == 0) {
    if (in_device != nullptr && sources[0]->kind() == MemoryKind::kDevice) {
      *in_device = sources[0]->device_buffer();
      keep->push_back(sources[0]);
      return builtin::ConstTensor{*local, sources[0]->data()};
    }
    auto host = Storage::InHostMemory(sources[0], /*shareable=*/false);
    if (!host.ok()) return host.status();
    keep->push_back(*host);
    return builtin::ConstTensor{*local, (*host)->data()};
  }
  // Pieces are cut on the host.
  for (auto& source : sources) {
    auto host = Storage::InHostMemory(source, /*shareable=*/false);
    if (!host.ok()) return host.status();
    source = *std::move(host);
  }
  // Assemble the input from pieces of its sources.
  absl::Status reserve = store.Reserve(device, bytes, reserved_ahead);
  if (!reserve.ok()) return reserve;
  *reserved_bytes += bytes;
  auto assembled = Storage::AllocateForWrite(bytes);
  if (!assembled.ok()) return assembled.status();
  const int axis = binding.axis();
  const size_t elem = DTypeSize(local->dtype);
  for (int p = 0; p < binding.pieces_size(); ++p) {
    const proto::Piece& piece = binding.pieces(p);
    if (piece.extent_size() > 0) {  // a box of a block (mesh layouts)
      auto shape = [](const auto& field) {
        return Shape(field.begin(), field.end());
      };
      absl::Status copied = CopyBox(
          sources[p]->data(), sources[p]->size(), shape(piece.src_shape()),
          shape(piece.src_start()), (*assembled)->data(), (*assembled)->size(),
          local->shape, shape(piece.dst_start()), shape(piece.extent()), elem);
      if (!copied.ok()) {
        return absl::InternalError(
            absl::StrCat("assembling an input from ",
                         KeyString({piece.buffer_id(), piece.shard()}), ": ",
                         copied.message()));
      }
      continue;
    }
    // The source's rows along `axis`: its size over the other dims.
    Shape src_shape = local->shape;
    int64_t other = elem;
    for (size_t i = 0; i < src_shape.size(); ++i) {
      if (static_cast<int>(i) != axis) other *= src_shape[i];
    }
    if (other == 0) continue;  // an empty array: no rows to copy
    if (!src_shape.empty() && axis >= 0 &&
        axis < static_cast<int>(src_shape.size())) {
      src_shape[axis] = static_cast<int64_t>(sources[p]->size()) / other;
    }
    absl::Status copied =
        CopyRows(sources[p]->data(), sources[p]->size(), src_shape,
                 (*assembled)->data(), (*assembled)->size(), local->shape, axis,
                 piece.src_offset(), piece.dst_offset(), piece.length(), elem);
    if (!copied.ok()) {
      return absl::InternalError(
          absl::StrCat("assembling an input from ",
                       KeyString({piece.buffer_id(), piece.shard()}), ": ",
                       copied.message()));
    }
  }
  std::shared_ptr<const Storage> result = std::move(*assembled);
  keep->push_back(result);
  return builtin::ConstTensor{*local, result->data()};
}

}  // namespace plexus
