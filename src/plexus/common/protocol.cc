#include "plexus/common/protocol.h"

#include "absl/strings/str_cat.h"

namespace plexus {

absl::Status CheckProtocolVersion(absl::string_view me, absl::string_view them,
                                  int32_t theirs) {
  if (theirs == kProtocolVersion) return absl::OkStatus();
  const std::string spoken =
      theirs == 0 ? std::string(
                        "no protocol version (a release older than "
                        "versioned registration)")
                  : absl::StrCat("protocol version ", theirs);
  return absl::FailedPreconditionError(absl::StrCat(
      "protocol version mismatch: the ", them, " speaks ", spoken, ", this ",
      me, " speaks protocol version ", kProtocolVersion,
      " (run the same Plexus release on the server, every worker and every "
      "client)"));
}

}  // namespace plexus
