// Fuzz target: the journal's reader (src/plexus/journal/internal/record.h),
// through Journal::OpenWithStore over an in-memory store holding what the
// input says: the records a crashed or corrupted disk could hand back.
//
// Input: u8 flags, u64 first key, then entries: u8 skip (the next key is the
// previous + 1 + skip), and a record (u16 length, the stored value). Flag
// bit 0: the harness writes each value's CRC itself, so that inputs reach
// the checks after the checksum (lengths, sequence numbers, types, gaps,
// snapshots) as well as the checksum itself.
//
// Besides crashes, it checks what the journal promises: what is replayed is
// contiguous, starts at record 1 or with a snapshot, and is exactly what was
// stored (nothing untrusted is trusted); a stop is a DataLoss that names the
// journal; the untrusted tail leaves the journal, and appending resumes
// right after the last good record.
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/base/internal/endian.h"
#include "fuzz/fuzz_support.h"
#include "plexus/journal/internal/record.h"
#include "plexus/journal/internal/store.h"
#include "plexus/journal/journal.h"

namespace {

using plexus::journal::internal::JournalStore;
using plexus::journal::internal::StoredRecord;

// Not thread-safe, like every store: Open's thread, then the writer's.
class MemoryStore : public JournalStore {
 public:
  explicit MemoryStore(std::map<uint64_t, std::string>* records)
      : records_(records) {}
  absl::Status Write(absl::Span<const StoredRecord> records) override {
    for (const StoredRecord& r : records) (*records_)[r.key] = r.value;
    return absl::OkStatus();
  }
  absl::Status Scan(
      absl::FunctionRef<bool(uint64_t, absl::string_view)> fn) override {
    for (const auto& [key, value] : *records_) {
      if (!fn(key, value)) break;
    }
    return absl::OkStatus();
  }
  absl::Status ReplacePrefix(const StoredRecord& r) override {
    records_->erase(records_->begin(), records_->upper_bound(r.key));
    (*records_)[r.key] = r.value;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> DiscardFrom(uint64_t from) override {
    auto first = records_->lower_bound(from);
    const uint64_t n = std::distance(first, records_->end());
    records_->erase(first, records_->end());
    return n;
  }

 private:
  std::map<uint64_t, std::string>* const records_;
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "journal_reader_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace j = plexus::journal;
  namespace in = plexus::journal::internal;
  plexus::fuzz::InputReader reader(data, size);
  const uint8_t flags = reader.U8();
  uint64_t key = reader.U64();
  std::map<uint64_t, std::string> stored;
  for (bool first = true; !reader.empty() && stored.size() < 4096;
       first = false) {
    const uint8_t skip = reader.U8();
    if (!first) key += 1 + skip;
    std::string value = reader.Record();
    if ((flags & 1) && value.size() >= in::kHeaderBytes) {
      absl::little_endian::Store32(
          value.data(),
          static_cast<uint32_t>(
              crc32(0L, reinterpret_cast<const Bytef*>(value.data() + 4),
                    static_cast<uInt>(value.size() - 4))));
    }
    stored[key] = std::move(value);
  }
  const std::map<uint64_t, std::string> before = stored;

  j::JournalOptions options;
  options.path = "fuzz";
  j::Replay replay;
  auto journal = j::Journal::OpenWithStore(
      options, std::make_unique<MemoryStore>(&stored), &replay);
  if (!journal.ok()) Fail("open failed: " + journal.status().ToString());

  uint64_t last = 0;
  for (size_t i = 0; i < replay.records.size(); ++i) {
    const j::JournalRecord& r = replay.records[i];
    if (r.type == j::kSnapshotType ? i != 0 : r.seq != last + 1) {
      Fail("replayed out of order at record " + std::to_string(r.seq));
    }
    auto it = before.find(r.seq);
    if (it == before.end() ||
        in::EncodeRecord(r.seq, r.type, r.payload) != it->second) {
      Fail("replayed record " + std::to_string(r.seq) +
           " is not what was stored");
    }
    last = r.seq;
  }
  const size_t untrusted = before.size() - replay.records.size();
  if (replay.tail.ok() != (untrusted == 0) || replay.discarded != untrusted ||
      stored.size() != replay.records.size()) {
    Fail("the untrusted tail: " + std::to_string(untrusted) + " record(s), " +
         std::to_string(replay.discarded) + " discarded, tail " +
         replay.tail.ToString());
  }
  if (!replay.tail.ok() &&
      (replay.tail.code() != absl::StatusCode::kDataLoss ||
       replay.tail.message().find("journal fuzz: replay stopped after") != 0)) {
    Fail("an unclear tail status: " + replay.tail.ToString());
  }
  absl::StatusOr<uint64_t> next = (*journal)->Append(1, "next");
  if (!next.ok() || *next != last + 1 ||
      !(*journal)->AwaitDurable(*next, absl::InfiniteFuture()).ok()) {
    Fail("appending after the replay did not resume at " +
         std::to_string(last + 1));
  }
  return 0;
}
