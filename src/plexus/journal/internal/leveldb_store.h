// The journal's store in LevelDB (1.23, Debian 12's libleveldb), for the
// benchmark that chose between it and SQLite (bench/journal.cc): keys are
// sequence numbers as 8 big-endian bytes, each Write is one WriteBatch with
// sync=true. DiscardFrom deletes (LevelDB has no second table to keep them).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "plexus/journal/internal/store.h"

namespace plexus::journal::internal {

// Opens or creates the database directory at `path`. Errors name the path.
absl::StatusOr<std::unique_ptr<JournalStore>> OpenLevelDbStore(
    const std::string& path);

}  // namespace plexus::journal::internal
