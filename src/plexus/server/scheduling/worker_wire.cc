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

// Appends `tag`, then `length` as a varint.
void AppendHeader(uint8_t tag, uint64_t length, std::string* out) {
  uint8_t header[1 + 10];
  header[0] = tag;
  uint8_t* end = Coded::WriteVarint64ToArray(length, header + 1);
  out->append(reinterpret_cast<const char*>(header), end - header);
}

// Appends `message`, serialized, with its tag and length.
void AppendMessage(uint8_t tag, const google::protobuf::MessageLite& message,
                   std::string* out) {
  const size_t size = message.ByteSizeLong();
  AppendHeader(tag, size, out);
  const size_t at = out->size();
  out->resize(at + size);
  message.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out->data() + at));
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
  return 1 + VarintSize(execute) + execute;
}

void CallExecutes::AppendWorkerOp(int host, std::string* out) const {
  const Host& h = hosts_[host];
  AppendHeader(kExecuteTag, ExecuteSize(host), out);
  out->append(shared_);
  out->append(tasks_, h.begin, h.end - h.begin);
  if (ticket_ != 0) {
    uint8_t bytes[1 + 10];
    bytes[0] = kTicketTag;
    uint8_t* end = Coded::WriteVarint64ToArray(ticket_, bytes + 1);
    out->append(reinterpret_cast<const char*>(bytes), end - bytes);
  }
  if (start_tag_ != 0) {
    uint8_t bytes[1 + 8];
    bytes[0] = kStartTagTag;
    Coded::WriteLittleEndian64ToArray(WireFormatLite::EncodeDouble(start_tag_),
                                      bytes + 1);
    out->append(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  }
}

proto::Execute CallExecutes::Execute(int host) const {
  std::string op;
  AppendWorkerOp(host, &op);
  proto::WorkerOp parsed;
  parsed.ParseFromString(op);
  return std::move(*parsed.mutable_execute());
}

void AppendOps(const std::vector<OutOp>& ops, std::string* out) {
  for (const OutOp& op : ops) {
    if (op.call == nullptr) {
      AppendMessage(kOpTag, op.op, out);
    } else {
      AppendHeader(kOpTag, op.call->WorkerOpSize(op.host), out);
      op.call->AppendWorkerOp(op.host, out);
    }
  }
}

}  // namespace plexus
