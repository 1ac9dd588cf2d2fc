// The strings a client names things with: its session, its programs and
// their kernels, attributes (names and string values) and XLA platform, a
// slice's axes and hosts, a layout's mesh axes (ValidateSharding). Each is
// bounded by CheckName (a call site's text is cut to kMaxNameBytes), so
// that what the server keeps, logs and shows in `plexus status` stays
// small whatever one client sends (a client name of 6 MiB once made
// status fail for every client and wrote 6 MiB to the log per connect).
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

inline constexpr size_t kMaxNameBytes = 256;

// OK, or INVALID_ARGUMENT naming `what` ("client name", "program name")
// and what is wrong: longer than kMaxNameBytes (its length said, the name
// not echoed), or a control character (a byte below 0x20, or 0x7f).
absl::Status CheckName(absl::string_view what, absl::string_view name);

// CheckName of each string of a program that a client names things with:
// its name, then (the error prefixed "program '<name>': ") its kernel's
// name, its attributes' names and string values, an XLA program's
// platform. The server checks every program it is sent; the client checks
// first, so that the error is raised where the program was made.
absl::Status CheckProgramStrings(const proto::ProgramDef& def);

// `text` for a message or a log line: as it is when short (at most 64
// bytes), else its first 64 bytes, "...", and its length.
std::string Abbreviated(absl::string_view text);

}  // namespace plexus
