#include "plexus/journal/internal/record.h"

#include <zlib.h>

#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace plexus::journal::internal {
namespace {

uint32_t Crc(absl::string_view bytes) {
  // zlib's crc32 takes a uInt length: records are below kMaxPayloadBytes.
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()),
            static_cast<uInt>(bytes.size())));
}

}  // namespace

std::string EncodeRecord(uint64_t seq, uint16_t type,
                         absl::string_view payload) {
  std::string out(kHeaderBytes + payload.size(), '\0');
  char* p = out.data();
  absl::little_endian::Store64(p + kSeqOffset, seq);
  absl::little_endian::Store16(p + kTypeOffset, type);
  absl::little_endian::Store32(p + kLengthOffset,
                               static_cast<uint32_t>(payload.size()));
  if (!payload.empty()) {
    std::memcpy(p + kPayloadOffset, payload.data(), payload.size());
  }
  absl::little_endian::Store32(p + kCrcOffset,
                               Crc(absl::string_view(out).substr(kSeqOffset)));
  return out;
}

absl::StatusOr<JournalRecord> DecodeRecord(uint64_t key,
                                           absl::string_view value) {
  if (value.size() < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "record ", key, ": truncated: ", value.size(),
        " bytes, shorter than the ", kHeaderBytes, "-byte header"));
  }
  const char* p = value.data();
  const uint32_t length = absl::little_endian::Load32(p + kLengthOffset);
  if (length > kMaxPayloadBytes || length != value.size() - kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "record ", key, ": torn: its length field says ", length,
        " payload bytes, the store holds ", value.size() - kHeaderBytes));
  }
  const uint32_t stored = absl::little_endian::Load32(p + kCrcOffset);
  const uint32_t computed = Crc(value.substr(kSeqOffset));
  if (stored != computed) {
    return absl::DataLossError(
        absl::StrFormat("record %d: checksum mismatch (stored 0x%08x, "
                        "computed 0x%08x over %d bytes)",
                        key, stored, computed, value.size() - kSeqOffset));
  }
  JournalRecord record;
  record.seq = absl::little_endian::Load64(p + kSeqOffset);
  if (record.seq != key) {
    return absl::DataLossError(absl::StrCat(
        "record ", key, ": misplaced: it says it is record ", record.seq));
  }
  record.type = absl::little_endian::Load16(p + kTypeOffset);
  record.payload.assign(p + kPayloadOffset, length);
  return record;
}

bool ReplayReader::Add(uint64_t key, absl::string_view value) {
  if (stopped()) return false;
  absl::Status reason;
  absl::StatusOr<JournalRecord> record = DecodeRecord(key, value);
  if (key > kMaxSeq) {
    reason = absl::DataLossError(absl::StrCat(
        "record ", key, ": past the last sequence number ", kMaxSeq));
  } else if (!record.ok()) {
    reason = record.status();
  } else if (record->type == kSnapshotType && !records_.empty()) {
    reason = absl::DataLossError(
        absl::StrCat("record ", key, ": a snapshot after record ", last_seq_,
                     " (a snapshot can only come first)"));
  } else if (record->type != kSnapshotType && key != last_seq_ + 1) {
    reason = absl::DataLossError(
        records_.empty()
            ? absl::StrCat("record ", key,
                           ": the journal starts there, neither at record 1 "
                           "nor with a snapshot")
            : absl::StrCat("record ", key, ": a gap after record ", last_seq_,
                           " (missing ", last_seq_ + 1, ")"));
  } else if (record->type == kSnapshotType && key == 0) {
    reason = absl::DataLossError("record 0: a snapshot of nothing");
  }
  if (!reason.ok()) {
    stop_reason_ = std::move(reason);
    first_bad_key_ = key;
    return false;
  }
  last_seq_ = key;
  records_.push_back(*std::move(record));
  return true;
}

Replay ReplayReader::Finish(uint64_t discarded) {
  Replay replay;
  replay.records = std::move(records_);
  replay.discarded = discarded;
  if (stopped()) {
    replay.tail = absl::DataLossError(absl::StrCat(
        "journal ", path_, ": replay stopped after record ", last_seq_, ": ",
        stop_reason_.message(), "; ", discarded, " record(s) from ",
        first_bad_key_, " on moved aside, not replayed"));
  }
  return replay;
}

}  // namespace plexus::journal::internal
