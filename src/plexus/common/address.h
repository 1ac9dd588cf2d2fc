// Network addresses as the operator writes them ("host:port", "[v6]:port"):
// which part is the host, and whether it is reachable from this machine
// only. Off loopback a process asks for credentials (docs/security.md); on
// loopback it needs no set-up.
//
// Thread-safe: pure functions.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace plexus {

// "10.0.0.1:50051" -> "10.0.0.1"; "[::1]:7" -> "::1"; no port: the input.
std::string HostOfAddress(absl::string_view address);

// True for a host that only this machine reaches: "localhost",
// 127.0.0.0/8, ::1. False for everything else, wildcards included
// ("0.0.0.0", "::", "" listen on every interface) and names other than
// localhost (they may resolve anywhere).
bool IsLoopbackHost(absl::string_view host);

// The gRPC target for a server address as clients and workers are given
// it: one address ("host:port", or any gRPC target: "dns:///name:port",
// "unix:path") as it is; a list of servers, a primary and its standbys
// ("10.0.0.1:7070,10.0.0.2:7070"), as one target that connects to the
// first that answers (gRPC's "ipv4:"/"ipv6:" list with pick_first: a
// standby listens only once it has taken over). An entry of a list is an
// IP address and port, or a name and port resolved here, once (to an IPv4
// address if it has one): give names that keep their address, such as one
// Kubernetes Service per server (deploy/kubernetes/plexus.yaml).
// InvalidArgument naming the entry for one with no port or a name that
// does not resolve, and for a list that mixes IPv4 and IPv6.
absl::StatusOr<std::string> ServerTarget(absl::string_view address);
// The name a list's channel checks the servers' TLS certificates against
// (and sends as its authority): its first entry as written
// ("plexus-server-a:7070"), so every server of the list presents a
// certificate that names it. Empty for one address (gRPC's own: the
// address).
std::string ServerListAuthority(absl::string_view address);
// Whether `address` is a list of servers (a primary and its standbys).
bool IsServerList(absl::string_view address);

// The longest wait between a worker's or client's attempts to reach its
// server again: `usual` for one server; for a list, at most
// kServerListRetryCap (its standby serves at the end of a lease, which a
// back-off grown to seconds would miss by as much).
inline constexpr absl::Duration kServerListRetryCap = absl::Milliseconds(250);
absl::Duration RetryCapFor(absl::string_view address, absl::Duration usual);

}  // namespace plexus
