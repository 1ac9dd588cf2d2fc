// JournalStore: where a Journal keeps its encoded records, keyed by sequence
// number. One backend per embedded store (sqlite_store.h, and LevelDB's for
// the benchmark); the Journal's checks (record.h) sit above every backend.
// Not thread-safe: one thread at a time (Open's, then the group-commit
// thread's).
#pragma once

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace plexus::journal::internal {

struct StoredRecord {
  uint64_t key = 0;
  std::string value;  // EncodeRecord's bytes
};

class JournalStore {
 public:
  virtual ~JournalStore() = default;

  // Writes `records` (keys ascending, none stored yet) as one atomic commit
  // and syncs it: when this returns OK they survive a crash or power loss.
  // On an error, none or all of them may survive.
  virtual absl::Status Write(absl::Span<const StoredRecord> records) = 0;
  // Calls `fn(key, value)` for every stored record, keys ascending, until it
  // returns false. Errors: the store cannot be read (DataLoss for a corrupt
  // file).
  virtual absl::Status Scan(
      absl::FunctionRef<bool(uint64_t, absl::string_view)> fn) = 0;
  // Atomically, and synced: removes every record with key <= replacement.key
  // and stores `replacement` under its key.
  virtual absl::Status ReplacePrefix(const StoredRecord& replacement) = 0;
  // Removes every record with key >= `from` from the journal, and returns
  // how many; a backend that can keeps them aside for inspection. Synced.
  virtual absl::StatusOr<uint64_t> DiscardFrom(uint64_t from) = 0;
};

}  // namespace plexus::journal::internal
