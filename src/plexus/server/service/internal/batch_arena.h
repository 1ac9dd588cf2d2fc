// Internal: the arena a client's batch is parsed onto, on the stream's
// thread (ServerImpl::ReadClientBatches) or the ops listener's
// (ClientOpsListener). A batch of chained calls is thousands of small
// messages: on the arena each is allocated by bumping a pointer in a block
// the reader reuses, and all are freed at once with the batch (routing
// copies what it keeps); a larger batch takes more blocks of this size,
// freed after it.
#pragma once

#include <cstddef>
#include <vector>

#include "google/protobuf/arena.h"

namespace plexus {

inline constexpr size_t kBatchArenaBlock = 256 << 10;

// Options for an arena whose first block is `block` (kBatchArenaBlock
// bytes, owned by the reader and reused from batch to batch).
inline google::protobuf::ArenaOptions BatchArenaOptions(
    std::vector<char>& block) {
  google::protobuf::ArenaOptions options;
  options.initial_block = block.data();
  options.initial_block_size = block.size();
  options.max_block_size = kBatchArenaBlock;
  return options;
}

}  // namespace plexus
