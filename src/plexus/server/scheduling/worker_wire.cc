#include "plexus/server/scheduling/worker_wire.h"

#include <cstring>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace plexus {
namespace {

using google::protobuf::internal::WireFormatLite;
using Coded = google::protobuf::io::CodedOutputStream;

constexpr uint8_t LengthTag(int field) {
  return static_cast<uint8_t>(WireFormatLite::MakeTag(
      field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
}
// Every tag below fits in one byte (field numbers under 16).
constexpr uint8_t kOpTag = LengthTag(proto::ServerToWorker::kOpsFieldNumber);
constexpr uint8_t kExecuteTag = LengthTag(proto::WorkerOp::kExecuteFieldNumber);
constexpr uint8_t kTaskTag = LengthTag(proto::Execute::kTasksFieldNumber);
constexpr uint8_t kTicketTag = static_cast<uint8_t>(WireFormatLite::MakeTag(
    proto::Execute::kTicketFieldNumber, WireFormatLite::WIRETYPE_VARINT));
constexpr uint8_t kStartTagTag = static_cast<uint8_t>(WireFormatLite::MakeTag(
    proto::Execute::kStartTagFieldNumber, WireFormatLite::WIRETYPE_FIXED64));
static_assert(proto::ServerToWorker::kOpsFieldNumber < 16 &&
                  proto::WorkerOp::kExecuteFieldNumber < 16 &&
                  proto::Execute::kTasksFieldNumber < 16 &&
                  proto::Execute::kTicketFieldNumber < 16 &&
                  proto::Execute::kStartTagFieldNumber < 16,
              "one-byte tags");

size_t VarintSize(uint64_t v) { return Coded::VarintSize64(v); }

// A length-delimited field's header: its one-byte tag, then its length.
uint8_t* WriteHeader(uint8_t tag, uint64_t length, uint8_t* target) {
  *target++ = tag;
  return Coded::WriteVarint64ToArray(length, target);
}

size_t HeaderSize(uint64_t length) { return 1 + VarintSize(length); }

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

CallExecutes::CallExecutes(const proto::Execute& shared)
    : call_id_(shared.call_id()),
      program_id_(shared.program_id()),
      output_ids_(shared.output_ids().begin(), shared.output_ids().end()) {
  shared.SerializeToString(&shared_);
}

void CallExecutes::AddHost(int64_t worker_id,
                           absl::Span<const proto::ShardTask* const> tasks) {
  const uint32_t begin = static_cast<uint32_t>(tasks_.size());
  for (const proto::ShardTask* task : tasks) {
    AppendMessage(kTaskTag, *task, &tasks_);
  }
  hosts_.push_back({worker_id, begin, static_cast<uint32_t>(tasks_.size())});
}

size_t CallExecutes::ExecuteSize(int host) const {
  const Host& h = hosts_[host];
  size_t size = shared_.size() + (h.end - h.begin);
  if (ticket_ != 0) size += 1 + VarintSize(ticket_);
  if (start_tag_ != 0) size += 1 + 8;
  return size;
}

size_t CallExecutes::WorkerOpSize(int host) const {
  const size_t execute = ExecuteSize(host);
  return HeaderSize(execute) + execute;
}

uint8_t* CallExecutes::WriteWorkerOp(int host, uint8_t* target) const {
  const Host& h = hosts_[host];
  target = WriteHeader(kExecuteTag, ExecuteSize(host), target);
  std::memcpy(target, shared_.data(), shared_.size());
  target += shared_.size();
  std::memcpy(target, tasks_.data() + h.begin, h.end - h.begin);
  target += h.end - h.begin;
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
  return std::move(*parsed.mutable_execute());
}

size_t OpsSize(const std::vector<OutOp>& ops) {
  size_t size = 0;
  for (const OutOp& op : ops) {
    const size_t one = op.encoded != nullptr ? op.encoded->bytes.size()
                       : op.call == nullptr  ? op.op.ByteSizeLong()
                                             : op.call->WorkerOpSize(op.host);
    size += HeaderSize(one) + one;
  }
  return size;
}

uint8_t* WriteOps(const std::vector<OutOp>& ops, uint8_t* target) {
  for (const OutOp& op : ops) {
    if (op.encoded != nullptr) {
      const std::string& bytes = op.encoded->bytes;
      target = WriteHeader(kOpTag, bytes.size(), target);
      std::memcpy(target, bytes.data(), bytes.size());
      target += bytes.size();
    } else if (op.call == nullptr) {
      target = WriteHeader(kOpTag, op.op.GetCachedSize(), target);
      target = op.op.SerializeWithCachedSizesToArray(target);
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
