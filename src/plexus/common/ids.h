// The ids a client names its buffers and programs with, and the key of one
// shard of a buffer: the one place their layout is written.
//
// An id is 64 bits: the top 24 name the client that owns it (its client
// id, which the server gives at connect and which the session's data-plane
// credential derives from), the low 40 count. Of the count, bit 39 marks
// ids the server made in the client's namespace (the outputs of calls that
// recovery routes again under new ids), so that they never collide with
// the client's own, which count up from 1. Buffers the server makes for
// itself (transfer temporaries) belong to kServerClientId.
//
// An id names its owner, but an id is not a capability: every boundary
// checks that the sender owns what it names (ClientOfBuffer against the
// session's client id, on the server and on the data plane).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace plexus {

inline constexpr int kBufferIdClientShift = 40;
// The client id of buffers the server makes for itself; no client gets it.
inline constexpr uint64_t kServerClientId = 0xFFFFFF;

// The client that owns `id` (a buffer's or a program's).
inline constexpr uint64_t ClientOfBuffer(uint64_t id) {
  return id >> kBufferIdClientShift;
}
// The `n`th id (from 1) client `client_id` makes.
inline constexpr uint64_t ClientMadeId(uint64_t client_id, uint64_t n) {
  return (client_id << kBufferIdClientShift) | n;
}
// The `n`th id the server makes in client `client_id`'s namespace.
inline constexpr uint64_t ServerMadeId(uint64_t client_id, uint64_t n) {
  return ClientMadeId(client_id,
                      (uint64_t{1} << (kBufferIdClientShift - 1)) | n);
}
inline constexpr bool IsServerMade(uint64_t id) {
  return (id >> (kBufferIdClientShift - 1)) & 1;
}

// The most ids one counter of this layout makes: a client's own count
// (ClientMadeId: its buffers, calls and programs) and the server's in the
// clients' namespaces (ServerMadeId, one count for all clients) each have
// 39 bits. Past it an id would spill into the other half of the count, or
// into the next client's ids.
inline constexpr uint64_t kMaxIdCount =
    (uint64_t{1} << (kBufferIdClientShift - 1)) - 1;

// Whether the temporary counted `count` (ClientMadeId(kServerClientId,
// count)) was made before the one counted `floor`, by a counter that starts
// again at 1 after kMaxIdCount: counts up to half the space behind `floor`
// are earlier, the rest (the counter's wrap) are not.
inline constexpr bool IsEarlierTemporary(uint64_t count, uint64_t floor) {
  const uint64_t behind =
      floor >= count ? floor - count : floor + kMaxIdCount - count;
  return behind > 0 && behind <= kMaxIdCount / 2;
}

// The one check every counter of ids makes before it hands out ids
// `first` .. `first + count - 1` (first >= 1): OK while the last is at
// most kMaxIdCount, else RESOURCE_EXHAUSTED saying that `what` ("this
// client's ids") ran out, and after how many. Never wraps.
absl::Status CheckIdsLeft(absl::string_view what, uint64_t first,
                          uint64_t count = 1);

// One shard of a buffer: the key of the object store, of the data plane's
// frames and of transfers.
struct ShardKey {
  uint64_t buffer_id = 0;
  int32_t shard = 0;
  bool operator==(const ShardKey& o) const {
    return buffer_id == o.buffer_id && shard == o.shard;
  }
  template <typename H>
  friend H AbslHashValue(H h, const ShardKey& k) {
    return H::combine(std::move(h), k.buffer_id, k.shard);
  }
};
// "buffer 12 shard 0", for messages and log lines.
std::string KeyString(const ShardKey& key);

}  // namespace plexus
