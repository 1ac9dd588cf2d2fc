// Network addresses as the operator writes them ("host:port", "[v6]:port"):
// which part is the host, and whether it is reachable from this machine
// only. Off loopback a process asks for credentials (docs/security.md); on
// loopback it needs no set-up.
//
// Thread-safe: pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace plexus {

// "10.0.0.1:50051" -> "10.0.0.1"; "[::1]:7" -> "::1"; no port: the input.
std::string HostOfAddress(absl::string_view address);

// True for a host that only this machine reaches: "localhost",
// 127.0.0.0/8, ::1. False for everything else, wildcards included
// ("0.0.0.0", "::", "" listen on every interface) and names other than
// localhost (they may resolve anywhere).
bool IsLoopbackHost(absl::string_view host);

}  // namespace plexus
