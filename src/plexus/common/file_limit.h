// Every memfd-backed shard holds a descriptor open (so it can be sent
// again), so a process with many large shards needs more than the default
// soft limit of 1024 descriptors.
#pragma once

namespace plexus {

// Raises this process's RLIMIT_NOFILE soft limit to its hard limit. Safe to
// call more than once.
void RaiseOpenFileLimit();

}  // namespace plexus
