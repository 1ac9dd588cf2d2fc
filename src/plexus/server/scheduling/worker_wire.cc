#include "plexus/server/scheduling/worker_wire.h"

#include <cstring>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "plexus/common/shard_layouts.h"

namespace plexus {
namespace {

using google::protobuf::internal::WireFormatLite;
using Coded = google::protobuf::io::CodedOutputStream;

constexpr uint8_t LengthTag(int field) {
  return static_cast<uint8_t>(WireFormatLite::MakeTag(
      field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
}
constexpr uint8_t VarintTag(int field) {
  return static_cast<uint8_t>(
      WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_VARINT));
}
// Every tag below fits in one byte (field numbers under 16).
constexpr uint8_t kOpTag = LengthTag(proto::ServerToWorker::kOpsFieldNumber);
constexpr uint8_t kExecuteTag = LengthTag(proto::WorkerOp::kExecuteFieldNumber);
constexpr uint8_t kTaskTag = LengthTag(proto::Execute::kTasksFieldNumber);
constexpr uint8_t kTicketTag = VarintTag(proto::Execute::kTicketFieldNumber);
constexpr uint8_t kLayoutIdTag =
    VarintTag(proto::Execute::kLayoutIdFieldNumber);
constexpr uint8_t kOwnTaskTag = LengthTag(proto::Execute::kOwnTaskFieldNumber);
constexpr uint8_t kStartTagTag = static_cast<uint8_t>(WireFormatLite::MakeTag(
    proto::Execute::kStartTagFieldNumber, WireFormatLite::WIRETYPE_FIXED64));
// A shard task's fields (CallExecutes::AddOwnShardsHosts).
constexpr uint8_t kTaskDeviceTag =
    VarintTag(proto::ShardTask::kDeviceFieldNumber);
constexpr uint8_t kTaskShardTag =
    VarintTag(proto::ShardTask::kShardFieldNumber);
constexpr uint8_t kTaskInputTag =
    LengthTag(proto::ShardTask::kInputsFieldNumber);
constexpr uint8_t kBindingPieceTag =
    LengthTag(proto::InputBinding::kPiecesFieldNumber);
constexpr uint8_t kBindingAxisTag =
    VarintTag(proto::InputBinding::kAxisFieldNumber);
constexpr uint8_t kBindingLocalTag =
    LengthTag(proto::InputBinding::kLocalFieldNumber);
constexpr uint8_t kBindingDonateTag =
    VarintTag(proto::InputBinding::kDonateFieldNumber);
constexpr uint8_t kPieceBufferTag =
    VarintTag(proto::Piece::kBufferIdFieldNumber);
constexpr uint8_t kPieceShardTag = VarintTag(proto::Piece::kShardFieldNumber);
constexpr uint8_t kPieceLengthTag = VarintTag(proto::Piece::kLengthFieldNumber);
static_assert(proto::ServerToWorker::kOpsFieldNumber < 16 &&
                  proto::WorkerOp::kExecuteFieldNumber < 16 &&
                  proto::Execute::kTasksFieldNumber < 16 &&
                  proto::Execute::kTicketFieldNumber < 16 &&
                  proto::Execute::kStartTagFieldNumber < 16 &&
                  proto::Execute::kLayoutIdFieldNumber < 16 &&
                  proto::Execute::kOwnTaskFieldNumber < 16 &&
                  proto::ShardTask::kInputsFieldNumber < 16 &&
                  proto::InputBinding::kDonateFieldNumber < 16 &&
                  proto::Piece::kLengthFieldNumber < 16,
              "one-byte tags");

size_t VarintSize(uint64_t v) { return Coded::VarintSize64(v); }

// A length-delimited field's header: its one-byte tag, then its length.
uint8_t* WriteHeader(uint8_t tag, uint64_t length, uint8_t* target) {
  *target++ = tag;
  return Coded::WriteVarint64ToArray(length, target);
}

size_t HeaderSize(uint64_t length) { return 1 + VarintSize(length); }

// An int32 or int64 field's varint, as protobuf writes it: a negative
// value as its 64-bit two's complement (ten bytes).
size_t IntSize(int64_t v) { return VarintSize(static_cast<uint64_t>(v)); }
uint8_t* WriteInt(uint8_t tag, int64_t v, uint8_t* target) {
  *target++ = tag;
  return Coded::WriteVarint64ToArray(static_cast<uint64_t>(v), target);
}
// A proto3 scalar field: written only where it is not zero.
size_t ScalarSize(int64_t v) { return v == 0 ? 0 : 1 + IntSize(v); }
uint8_t* WriteScalar(uint8_t tag, int64_t v, uint8_t* target) {
  return v == 0 ? target : WriteInt(tag, v, target);
}

// Appends `message`, serialized, with its tag and length.
void AppendMessage(uint8_t tag, const google::protobuf::MessageLite& message,
                   std::string* out) {
  const size_t size = message.ByteSizeLong();
  const size_t at = out->size();
  out->resize(at + HeaderSize(size) + size);
  uint8_t* target = reinterpret_cast<uint8_t*>(out->data() + at);
  message.SerializeWithCachedSizesToArray(WriteHeader(tag, size, target));
}

}  // namespace

CallExecutes::CallExecutes(const proto::Execute& shared, int hosts)
    : call_id_(shared.call_id()),
      program_id_(shared.program_id()),
      output_ids_(shared.output_ids().begin(), shared.output_ids().end()),
      relay_(shared.relay()) {
  shared.SerializeToString(&shared_);
  hosts_.reserve(hosts);
}

void CallExecutes::AddHost(int64_t worker_id,
                           absl::Span<const proto::ShardTask* const> tasks) {
  const uint32_t begin = static_cast<uint32_t>(tasks_.size());
  for (const proto::ShardTask* task : tasks) {
    AppendMessage(kTaskTag, *task, &tasks_);
  }
  hosts_.push_back({worker_id, begin, static_cast<uint32_t>(tasks_.size())});
}

void CallExecutes::AddOwnShardsHosts(
    absl::Span<const std::pair<int64_t, int>> hosts,
    absl::Span<const DeviceShard> tasks,
    absl::Span<const OwnShardInput> inputs) {
  // A binding is [its piece: buffer id, shard, length], axis, local,
  // donate (field-number order, as protobuf writes them): everything but
  // the shard is the same for every task, encoded once here. Per input:
  // the piece's bytes before the shard and after it, then the binding's
  // after the piece.
  struct Parts {
    size_t head, tail, rest;  // their sizes, in `fixed` one after another
  };
  absl::InlinedVector<Parts, 4> parts;
  std::string fixed;
  for (const OwnShardInput& in : inputs) {
    const size_t local = in.local->size();
    Parts& part = parts.emplace_back();
    part.head = in.buffer_id == 0 ? 0 : 1 + VarintSize(in.buffer_id);
    part.tail = ScalarSize(in.length);
    part.rest =
        ScalarSize(in.axis) + HeaderSize(local) + local + (in.donate ? 2 : 0);
    const size_t at = fixed.size();
    fixed.resize(at + part.head + part.tail + part.rest);
    uint8_t* p = reinterpret_cast<uint8_t*>(fixed.data() + at);
    if (in.buffer_id != 0) {
      *p++ = kPieceBufferTag;
      p = Coded::WriteVarint64ToArray(in.buffer_id, p);
    }
    p = WriteScalar(kPieceLengthTag, in.length, p);
    p = WriteScalar(kBindingAxisTag, in.axis, p);
    p = WriteHeader(kBindingLocalTag, local, p);
    std::memcpy(p, in.local->data(), local);
    p += local;
    if (in.donate) WriteInt(kBindingDonateTag, 1, p);
  }
  // Sizes (each length-delimited field's length precedes it), then bytes.
  auto task_size = [&](const DeviceShard& t) {
    const size_t shard = ScalarSize(t.shard);
    size_t task = ScalarSize(t.device) + shard;
    for (const Parts& part : parts) {
      const size_t piece = part.head + shard + part.tail;
      const size_t binding = HeaderSize(piece) + piece + part.rest;
      task += HeaderSize(binding) + binding;
    }
    return task;
  };
  // A task whose device and shard are each 0 (left out) or one varint
  // byte (1 to 127: every host's, below 128 hosts) is, within its class
  // (which of the two are 0), the class's first task's bytes with its own
  // values in their places: the first is written field by field, noting
  // those places, and each later one copied from it and patched.
  struct Class {
    size_t size = 0;  // the task's (its header's length), 0: not sized
    size_t at = 0;    // where its first task's bytes are in tasks_
    bool written = false;
    absl::InlinedVector<uint32_t, 1> device_at;
    absl::InlinedVector<uint32_t, 4> shard_at;
  };
  Class classes[4];
  const bool copies = tasks.size() > 1;  // else nothing to copy from
  auto class_of = [&](const DeviceShard& t) -> Class* {
    if (!copies || t.device < 0 || t.device >= 128 || t.shard < 0 ||
        t.shard >= 128) {
      return nullptr;
    }
    return &classes[(t.device != 0 ? 2 : 0) + (t.shard != 0 ? 1 : 0)];
  };
  // Writes task `t` of `size` at `p`; notes its value bytes in `noted`.
  auto write_task = [&](const DeviceShard& t, size_t size, uint8_t* p,
                        Class* noted) {
    uint8_t* const start = p;
    auto note = [&](auto& places, int32_t v) {
      // WriteScalar's tag byte, then a one-byte value.
      if (noted != nullptr && v != 0) {
        places.push_back(static_cast<uint32_t>(p - start + 1));
      }
    };
    const size_t shard = ScalarSize(t.shard);
    p = WriteHeader(kTaskTag, size, p);
    if (noted != nullptr) note(noted->device_at, t.device);
    p = WriteScalar(kTaskDeviceTag, t.device, p);
    if (noted != nullptr) note(noted->shard_at, t.shard);
    p = WriteScalar(kTaskShardTag, t.shard, p);
    const char* f = fixed.data();
    for (const Parts& part : parts) {
      const size_t piece = part.head + shard + part.tail;
      p = WriteHeader(kTaskInputTag, HeaderSize(piece) + piece + part.rest, p);
      p = WriteHeader(kBindingPieceTag, piece, p);
      std::memcpy(p, f, part.head);
      p += part.head;
      if (noted != nullptr) note(noted->shard_at, t.shard);
      p = WriteScalar(kPieceShardTag, t.shard, p);
      std::memcpy(p, f + part.head, part.tail + part.rest);
      p += part.tail + part.rest;
      f += part.head + part.tail + part.rest;
    }
    return p;
  };
  absl::InlinedVector<size_t, 8> sizes;
  size_t bytes = 0;
  for (const DeviceShard& t : tasks) {
    Class* c = class_of(t);
    if (c == nullptr) {
      sizes.push_back(task_size(t));
    } else {
      if (c->size == 0) c->size = task_size(t);
      sizes.push_back(c->size);
    }
    bytes += HeaderSize(sizes.back()) + sizes.back();
  }
  size_t at = tasks_.size();
  tasks_.resize(at + bytes);
  uint8_t* p = reinterpret_cast<uint8_t*>(tasks_.data() + at);
  uint8_t* const base = p - at;
  size_t k = 0;
  for (const auto& [worker, count] : hosts) {
    const uint32_t begin = static_cast<uint32_t>(p - base);
    for (int c = 0; c < count; ++c, ++k) {
      const DeviceShard& t = tasks[k];
      Class* cls = class_of(t);
      if (cls == nullptr || !cls->written) {
        if (cls != nullptr) {
          cls->at = static_cast<size_t>(p - base);
          cls->written = true;
        }
        p = write_task(t, sizes[k], p, cls);
        continue;
      }
      const size_t n = HeaderSize(sizes[k]) + sizes[k];
      std::memcpy(p, base + cls->at, n);
      for (uint32_t i : cls->device_at) p[i] = static_cast<uint8_t>(t.device);
      for (uint32_t i : cls->shard_at) p[i] = static_cast<uint8_t>(t.shard);
      p += n;
    }
    hosts_.push_back({worker, begin, static_cast<uint32_t>(p - base)});
  }
}

proto::ShardLayout ShardLayoutMap::OpFor(int host, uint64_t client_id) const {
  proto::ShardLayout op;
  op.set_layout_id(layout_id);
  op.set_client_id(client_id);
  for (uint32_t k = begin[host]; k < begin[host + 1]; ++k) {
    op.add_devices(tasks[k].device);
    op.add_shards(tasks[k].shard);
  }
  return op;
}

void CallExecutes::AddOwnShardsLayout(
    std::shared_ptr<const ShardLayoutMap> layout,
    absl::Span<const OwnShardInput> inputs) {
  // The template: AddOwnShardsHosts's bytes for the one task of device 0
  // and shard 0 (both left out, as protobuf leaves out zeros), written as
  // a pseudo-host's and moved into the shared fields under own_task's tag
  // (one byte, as `tasks`': the same length-delimited encoding).
  const size_t at = tasks_.size();
  const DeviceShard origin{0, 0};
  AddOwnShardsHosts({{0, 1}}, {&origin, 1}, inputs);
  hosts_.pop_back();
  tasks_[at] = static_cast<char>(kOwnTaskTag);
  const size_t end = shared_.size();
  shared_.resize(end + 1 + VarintSize(layout->layout_id));
  uint8_t* p = reinterpret_cast<uint8_t*>(shared_.data() + end);
  *p++ = kLayoutIdTag;
  Coded::WriteVarint64ToArray(layout->layout_id, p);
  shared_.append(tasks_, at, std::string::npos);
  tasks_.resize(at);
  layout_ = std::move(layout);
}

void CallExecutes::Stamp(uint64_t ticket, double start_tag) {
  ticket_ = ticket;
  start_tag_ = start_tag;
  stamp_bytes_ = (ticket_ != 0 ? 1 + VarintSize(ticket_) : 0) +
                 (start_tag_ != 0 ? 1 + 8 : 0);
  op_bytes_.clear();
  if (layout_ != nullptr && hosts() > 0) {
    // Every host's bytes are the same: written once, here (before the
    // writers share them).
    std::string op(WorkerOpSize(0), '\0');
    WriteWorkerOp(0, reinterpret_cast<uint8_t*>(op.data()));
    op_bytes_ = std::move(op);
  }
}

size_t CallExecutes::ExecuteSize(int host) const {
  return shared_.size() + TaskBytes(host).size() + stamp_bytes_;
}

absl::string_view CallExecutes::TaskBytes(int host) const {
  // With a layout, none: every host's tasks are own_task. (A view into
  // tasks_ either way: memcpy of it never gets a null pointer.)
  if (layout_ != nullptr) return absl::string_view(tasks_.data(), 0);
  const Host& h = hosts_[host];
  return absl::string_view(tasks_).substr(h.begin, h.end - h.begin);
}

size_t CallExecutes::WorkerOpSize(int host) const {
  if (!op_bytes_.empty()) return op_bytes_.size();
  const size_t execute = ExecuteSize(host);
  return HeaderSize(execute) + execute;
}

uint8_t* CallExecutes::WriteWorkerOp(int host, uint8_t* target) const {
  if (!op_bytes_.empty()) {
    std::memcpy(target, op_bytes_.data(), op_bytes_.size());
    return target + op_bytes_.size();
  }
  const absl::string_view tasks = TaskBytes(host);
  target = WriteHeader(kExecuteTag, ExecuteSize(host), target);
  std::memcpy(target, shared_.data(), shared_.size());
  target += shared_.size();
  std::memcpy(target, tasks.data(), tasks.size());
  target += tasks.size();
  if (ticket_ != 0) {
    *target++ = kTicketTag;
    target = Coded::WriteVarint64ToArray(ticket_, target);
  }
  if (start_tag_ != 0) {
    *target++ = kStartTagTag;
    target = Coded::WriteLittleEndian64ToArray(
        WireFormatLite::EncodeDouble(start_tag_), target);
  }
  return target;
}

proto::Execute CallExecutes::Execute(int host) const {
  std::string op(WorkerOpSize(host), '\0');
  WriteWorkerOp(host, reinterpret_cast<uint8_t*>(op.data()));
  proto::WorkerOp parsed;
  parsed.ParseFromString(op);
  proto::Execute& exec = *parsed.mutable_execute();
  if (layout_ != nullptr) {
    // As the worker would expand it (it was told OpFor(host)).
    ShardLayouts layouts;
    layouts.Add(layout_->OpFor(host, exec.client_id()));
    (void)layouts.Expand(&exec);  // told just above: it is there
  }
  return std::move(exec);
}

size_t OpsSize(const std::vector<OutOp>& ops) {
  size_t size = 0;
  for (const OutOp& op : ops) {
    const size_t one = op.bytes != nullptr  ? op.size
                       : op.call == nullptr ? op.op->ByteSizeLong()
                                            : op.call->WorkerOpSize(op.host);
    size += HeaderSize(one) + one;
  }
  return size;
}

uint8_t* WriteOps(const std::vector<OutOp>& ops, uint8_t* target) {
  for (const OutOp& op : ops) {
    if (op.bytes != nullptr) {
      target = WriteHeader(kOpTag, op.size, target);
      std::memcpy(target, op.bytes, op.size);
      target += op.size;
    } else if (op.call == nullptr) {
      target = WriteHeader(kOpTag, op.op->GetCachedSize(), target);
      target = op.op->SerializeWithCachedSizesToArray(target);
    } else {
      target = WriteHeader(kOpTag, op.call->WorkerOpSize(op.host), target);
      target = op.call->WriteWorkerOp(op.host, target);
    }
  }
  return target;
}

void AppendOps(const std::vector<OutOp>& ops, std::string* out) {
  const size_t at = out->size();
  out->resize(at + OpsSize(ops));
  WriteOps(ops, reinterpret_cast<uint8_t*>(out->data() + at));
}

}  // namespace plexus
