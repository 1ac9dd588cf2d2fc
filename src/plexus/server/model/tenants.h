// Tenants: who the operator lets use a shared cluster, and how much.
//
// A client session belongs to one tenant: the name it authenticated as when
// its session opened (anonymous sessions belong to "default"). The operator
// writes each tenant's share and quotas in a JSON file given to the server
// (`plexus-server --tenants FILE`); a client cannot change its own. Every
// field is optional; a tenant missing from the file gets "default"'s policy,
// and "default" missing gets the built-in defaults below.
//
//   {
//     "default": {"weight": 1},
//     "tenants": {
//       "research": {"weight": 4, "max_devices": 8,
//                    "max_bytes": 17179869184, "max_calls_in_flight": 256}
//     }
//   }
//
//   weight               proportional share of device time when clients
//                        contend (a tenant with weight 2 gets twice the
//                        device time of one with weight 1); > 0
//   max_devices          devices over all of one client's slices (0: none)
//   max_bytes            bytes of one client's live buffers (0: none)
//   max_calls_in_flight  calls of one client admitted to workers and not
//                        yet finished; further calls wait at the server
//                        (0: the built-in default, 4096)
//   priority             an integer from -1000 to 1000 (default 0): a
//                        slice of a higher priority takes its devices from
//                        lower-priority slices that allow it (elastic,
//                        on_loss "shrink"), which shrink off them to their
//                        minimum and grow back when they free
//                        (ClusterState::YieldToPriorities); tenants of one
//                        priority share by weight
//
// Quotas are per client session; the weight is shared by the tenant's
// sessions in proportion. Immutable once loaded; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace plexus {

struct TenantPolicy {
  // Calls in flight when the file says nothing: a bound on one client's
  // backlog, deep enough for graphs of tiny calls (a smaller bound made
  // chained dispatch wait for completion reports). Fair shares come from
  // admission's order and windows, not from this.
  static constexpr int32_t kDefaultCallsInFlight = 4096;

  double weight = 1.0;
  int32_t max_devices = 0;
  int64_t max_bytes = 0;
  int32_t max_calls_in_flight = kDefaultCallsInFlight;
  static constexpr int32_t kMaxPriority = 1000;
  int32_t priority = 0;
};

inline constexpr char kDefaultTenant[] = "default";

class TenantTable {
 public:
  // Everyone gets the built-in defaults.
  TenantTable() = default;
  // InvalidArgument naming the tenant and field that is wrong (an unknown
  // field, a weight <= 0, a negative quota, text that is not JSON).
  static absl::StatusOr<TenantTable> FromJson(absl::string_view text);
  // FromJson of the file's contents; NotFound naming the path.
  static absl::StatusOr<TenantTable> Load(const std::string& path);

  const TenantPolicy& For(absl::string_view tenant) const;
  const std::map<std::string, TenantPolicy>& tenants() const {
    return tenants_;
  }

 private:
  TenantPolicy default_;
  std::map<std::string, TenantPolicy> tenants_;
};

}  // namespace plexus
