// Who is looking at the live page or /metrics, and what each may see.
//
// Every request but the page's static files carries
// "Authorization: Bearer <token>" (the page sends it from the token in its
// URL's fragment, which no browser sends to a server; Prometheus from its
// scrape configuration):
//
//   token               viewer     sees
//   <32 hex digits>     operator   everything. The admin credential
//                                  (`plexus token --admin`).
//   <tenant>:<32 hex>   tenant     its own clients, their slices, slice
//                                  requests and waits; the hosts and
//                                  devices (shared capacity) without other
//                                  clients' usage. The tenant token
//                                  (`plexus token --tenant NAME`).
//
// Both are checked against the cluster secret in constant time (common/
// credentials.h); a token is never logged.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "plexus/common/credentials.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus::web {

struct Viewer {
  bool is_operator = false;
  std::string tenant;  // set when !is_operator
  // "operator" or "tenant NAME": what the page shows as who is looking.
  std::string Describe() const;
};

// The viewer that `authorization` (the header's value; empty when there is
// none) proves. Unauthenticated when there is no token, naming the forms
// above; PermissionDenied when the token does not match this cluster's
// secret, or names a malformed tenant.
absl::StatusOr<Viewer> ViewerOf(const ClusterSecret& secret,
                                absl::string_view authorization);

// The token of each form ("<hex>", "<tenant>:<hex>"), as the CLI writes it.
std::string OperatorToken(const ClusterSecret& secret);
std::string TenantToken(const ClusterSecret& secret, absl::string_view tenant);

// Removes from `status` what `viewer` may not see (nothing for the
// operator): other tenants' clients, their slices, slice requests and
// waits, and their usage in the hosts' statistics.
void ShowOnly(const Viewer& viewer, proto::ClusterStatus* status);

}  // namespace plexus::web
