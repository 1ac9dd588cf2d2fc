#include "plexus/common/ids.h"

#include "absl/strings/str_cat.h"

namespace plexus {

std::string KeyString(const ShardKey& key) {
  return absl::StrCat("buffer ", key.buffer_id, " shard ", key.shard);
}

absl::Status CheckIdsLeft(absl::string_view what, uint64_t first,
                          uint64_t count) {
  if (first >= 1 && first <= kMaxIdCount && count <= kMaxIdCount - first + 1) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " ran out: an id counts at most ", kMaxIdCount,
                   " of them (common/ids.h), and ", first == 0 ? 0 : first - 1,
                   " were given; ids past that would be another's"));
}

}  // namespace plexus
