// absl::Status <-> proto::Status: how an error travels between processes
// (call and slice errors, workers down, failed buffers), so that the
// receiver rebuilds the status the sender had, code and message, and a
// Python caller gets the exception class of that code. The one place that
// converts; every error message of plexus.proto carries a proto::Status.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

proto::Status StatusToProto(const absl::Status& status);

// The status `proto` carries. An error is never read as success: a code
// outside absl::StatusCode, or OK (0) with a message, becomes UNKNOWN with
// the message intact. An empty proto (OK, no message) is OK.
absl::Status StatusFromProto(const proto::Status& proto);

// A worker's answer to a read (a fetch, a wait, a push) of a shard it
// released: ABORTED, naming `what` (the shard). The value moved (a resize
// or resume the server decided, whose note the reader has not applied yet)
// or its owner let it go; the reader resolves the value again and reads it
// where it is now. IsReleasedOnWorker recognises it on the other side.
absl::Status ReleasedOnWorkerError(const std::string& what);
bool IsReleasedOnWorker(const absl::Status& status);

}  // namespace plexus
