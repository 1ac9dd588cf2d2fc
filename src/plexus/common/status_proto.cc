#include "plexus/common/status_proto.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace plexus {

proto::Status StatusToProto(const absl::Status& status) {
  proto::Status proto;
  proto.set_code(static_cast<int32_t>(status.code()));
  proto.set_message(std::string(status.message()));
  return proto;
}

absl::Status StatusFromProto(const proto::Status& proto) {
  const int32_t code = proto.code();
  const bool known =
      code >= static_cast<int32_t>(absl::StatusCode::kOk) &&
      code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
  if (!known || (code == 0 && !proto.message().empty())) {
    return absl::UnknownError(proto.message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), proto.message());
}

namespace {
constexpr char kReleasedOnWorker[] = " was released on this worker";
constexpr char kServerWentAway[] =
    "the server went away before this shard was complete";
}  // namespace

absl::Status ReleasedOnWorkerError(const std::string& what) {
  return absl::AbortedError(absl::StrCat(
      what, kReleasedOnWorker,
      " (its value moved: a resize or resume; or its owner let it go): read "
      "it where it is now"));
}

bool IsReleasedOnWorker(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted &&
         absl::StrContains(status.message(), kReleasedOnWorker);
}

absl::Status ServerWentAwayError() {
  return absl::UnavailableError(absl::StrCat(
      kServerWentAway, " (the next server routes again what it needs)"));
}

bool IsServerWentAway(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         absl::StrContains(status.message(), kServerWentAway);
}

}  // namespace plexus
