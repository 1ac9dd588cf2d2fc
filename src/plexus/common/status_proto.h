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

// A worker's answer to a read of a shard that could not be completed
// because the worker's server went away (WorkerImpl::Resume fails what is
// pending): UNAVAILABLE. The reader's own session may not have seen the
// server go yet (the worker's stream broke first); IsServerWentAway tells
// it to wait for its session's end and the next server's resume, which
// routes again what the shard needs, then read again.
absl::Status ServerWentAwayError();
bool IsServerWentAway(const absl::Status& status);

}  // namespace plexus
