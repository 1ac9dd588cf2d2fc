// The journal's record format and its reader: what a store holds for one
// record, and the checks that decide whether a sequence of stored records is
// trusted. Pure functions, no I/O; the fuzz target (fuzz/journal_reader_fuzz)
// drives ReplayReader with arbitrary bytes.
//
// One record, as the store's value (little-endian):
//
//   offset  size  field
//   0       4     CRC-32 (zlib's, ISO 3309) of bytes [4, end)
//   4       8     sequence number; must equal the store's key
//   12      2     type tag (0: a snapshot, written by Compact)
//   14      4     payload length; must equal end - 18
//   18      n     payload
//
// A trusted journal is: optionally a snapshot first, then records whose
// sequence numbers run on by one (from 1, or from the snapshot's seq + 1),
// every one with a matching checksum. A snapshot anywhere but first is
// corrupt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "plexus/journal/journal.h"

namespace plexus::journal::internal {

inline constexpr size_t kHeaderBytes = 18;
inline constexpr size_t kCrcOffset = 0;
inline constexpr size_t kSeqOffset = 4;
inline constexpr size_t kTypeOffset = 12;
inline constexpr size_t kLengthOffset = 14;
inline constexpr size_t kPayloadOffset = 18;
static_assert(kPayloadOffset == kHeaderBytes,
              "the header ends where the payload starts");
// Sequence numbers stay below 2^63 (SQLite's keys are signed); a record
// above it is corrupt, and a journal refuses to append past it.
inline constexpr uint64_t kMaxSeq = (uint64_t{1} << 63) - 1;
// Above this a length field is corrupt, whatever the store holds.
inline constexpr uint32_t kMaxPayloadBytes = 1u << 30;

// The store's value for `record`.
std::string EncodeRecord(uint64_t seq, uint16_t type,
                         absl::string_view payload);

// Checks and decodes one stored value found under `key`. Errors
// (DataLoss): shorter than the header, length field disagreeing with the
// value's size, checksum mismatch (both values named), seq differing from
// the key. The message names the key, not the path: the caller adds it.
absl::StatusOr<JournalRecord> DecodeRecord(uint64_t key,
                                           absl::string_view value);

// Reads stored records in key order and keeps those that are trusted; the
// first that is not ends the replay.
class ReplayReader {
 public:
  // `path`: for messages.
  explicit ReplayReader(std::string path) : path_(std::move(path)) {}
  // Takes the next stored record. Returns false once the replay has stopped
  // (this record or an earlier one was not trusted); later calls do nothing.
  bool Add(uint64_t key, absl::string_view value);
  // Whether a bad record was seen, and the first bad key (meaningful then).
  bool stopped() const { return !stop_reason_.ok(); }
  uint64_t first_bad_key() const { return first_bad_key_; }
  // The sequence number of the last trusted record (0: none).
  uint64_t last_seq() const { return last_seq_; }
  // Moves out what was read: the trusted records, and the tail status (OK or
  // DataLoss: "journal PATH: replay stopped after record N: record K: WHY;
  // D record(s) from K on moved aside"). `discarded` is the number of
  // records the caller moved aside, for the message.
  Replay Finish(uint64_t discarded);

 private:
  const std::string path_;
  std::vector<JournalRecord> records_;
  uint64_t last_seq_ = 0;
  uint64_t first_bad_key_ = 0;
  absl::Status stop_reason_;
};

}  // namespace plexus::journal::internal
