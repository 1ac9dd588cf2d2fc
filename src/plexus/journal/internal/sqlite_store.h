// The journal's store in SQLite (3.40, Debian 12's libsqlite3): one table
// `records(seq INTEGER PRIMARY KEY, record BLOB)` in WAL mode with
// synchronous=FULL (each commit appends its pages to the WAL and fsyncs
// it), locking_mode=EXCLUSIVE (one process; no shared-memory index file).
// Records moved aside by DiscardFrom go to the table `untrusted`.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "plexus/journal/internal/store.h"

namespace plexus::journal::internal {

// Opens or creates the database at `path` and takes its exclusive lock.
// Errors name the path: FailedPrecondition (another process holds it),
// DataLoss (not a database, or corrupt), Internal otherwise.
absl::StatusOr<std::unique_ptr<JournalStore>> OpenSqliteStore(
    const std::string& path);

}  // namespace plexus::journal::internal
