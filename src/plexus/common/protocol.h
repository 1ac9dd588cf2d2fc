// The control-plane protocol version, and the check both ends of a session
// make at registration. The one place the version is written: a worker
// (RegisterWorker.protocol_version) and a client
// (ClientToServer.protocol_version) send it in their first message, the
// server sends its own back in its first reply, and each side refuses a
// peer that speaks another one, naming both. Bump it when a message
// changes meaning in a way an older peer would misread (a field added at
// the end that an older peer may ignore needs no bump).
// (The data plane's frames carry their own version: transport/internal/
// frame_socket.h, kFrameVersion.)
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace plexus {

// 1: the first versioned protocol. A peer built before versioning sends
// none (reads as 0).
// 2: a call's input (InputRef) leaves out its layout (`arg`) when it is
// the one the program was registered with: the program's, to the server
// (a version-1 server would refuse it as an empty layout).
// 3: a worker whose ops moved onto its data-plane connection sends
// everything there as REPORTS frames (heartbeats, timeline chunks and
// transfer failures too, not only calls done): a version-2 server would
// hear no heartbeat and declare it down.
// 4: an own-shards call's Execute names a shard layout (ShardLayout, told
// ahead) instead of listing its tasks: a version-3 worker would run none.
inline constexpr int32_t kProtocolVersion = 4;

// OK when `theirs` is kProtocolVersion. Otherwise FailedPrecondition naming
// both versions, from the point of view of `me` ("server", "worker",
// "client"), which refuses `them`; e.g. "protocol version mismatch: the
// worker speaks version 2, this server speaks version 1 (run the same
// Plexus release on every host)".
absl::Status CheckProtocolVersion(absl::string_view me, absl::string_view them,
                                  int32_t theirs);

}  // namespace plexus
