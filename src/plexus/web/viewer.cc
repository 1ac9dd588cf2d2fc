#include "plexus/web/viewer.h"

#include <cstdint>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace plexus::web {

namespace {

constexpr char kForms[] =
    "send \"Authorization: Bearer TOKEN\" with the operator's token "
    "(`plexus token --admin`) or a tenant's as NAME:TOKEN (`plexus token "
    "--tenant NAME`)";

// Keeps the elements of `field` that `keep` accepts, in order.
template <typename Field, typename Keep>
void KeepIf(Field* field, Keep keep) {
  int out = 0;
  for (int i = 0; i < field->size(); ++i) {
    if (keep(field->Get(i))) field->SwapElements(out++, i);
  }
  while (field->size() > out) field->RemoveLast();
}

}  // namespace

std::string Viewer::Describe() const {
  return is_operator ? "operator" : absl::StrCat("tenant ", tenant);
}

absl::StatusOr<Viewer> ViewerOf(const ClusterSecret& secret,
                                absl::string_view authorization) {
  absl::string_view value = absl::StripAsciiWhitespace(authorization);
  if (value.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("this request needs a token: ", kForms));
  }
  if (!absl::StartsWithIgnoreCase(value, "Bearer ")) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the Authorization header is not a bearer token: ", kForms));
  }
  absl::string_view token = absl::StripAsciiWhitespace(value.substr(7));
  Viewer viewer;
  absl::string_view hex = token;
  const size_t colon = token.rfind(':');
  if (colon != absl::string_view::npos) {
    viewer.tenant = std::string(token.substr(0, colon));
    hex = token.substr(colon + 1);
    if (absl::Status s = CheckTenantName(viewer.tenant); !s.ok()) {
      return absl::PermissionDeniedError(
          absl::StrCat("the token's tenant: ", s.message()));
    }
  }
  absl::StatusOr<Credential> credential = TenantTokenFromHex(hex);
  if (!credential.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the token is not 32 hex digits (optionally after NAME:): ", kForms));
  }
  const bool valid =
      viewer.tenant.empty()
          ? secret.Verify(CredentialRole::kAdmin, uint64_t{0},
                          credential->data(), credential->size())
          : secret.Verify(CredentialRole::kTenant, viewer.tenant,
                          credential->data(), credential->size());
  if (!valid) {
    return absl::PermissionDeniedError(
        viewer.tenant.empty()
            ? "the token is not this cluster's operator token"
            : absl::StrCat("the token is not tenant ", viewer.tenant,
                           "'s token in this cluster"));
  }
  viewer.is_operator = viewer.tenant.empty();
  return viewer;
}

std::string OperatorToken(const ClusterSecret& secret) {
  return OperatorTokenHex(secret);
}

std::string TenantToken(const ClusterSecret& secret, absl::string_view tenant) {
  return absl::StrCat(
      tenant, ":",
      TenantTokenHex(secret.Derive(CredentialRole::kTenant, tenant)));
}

void ShowOnly(const Viewer& viewer, proto::ClusterStatus* status) {
  if (viewer.is_operator) return;
  std::set<uint64_t> own;
  for (const proto::ClientStatus& c : status->clients()) {
    if (c.tenant() == viewer.tenant) own.insert(c.client_id());
  }
  auto mine = [&](uint64_t client_id) { return own.count(client_id) > 0; };
  KeepIf(status->mutable_clients(),
         [&](const proto::ClientStatus& c) { return mine(c.client_id()); });
  KeepIf(status->mutable_slices(),
         [&](const proto::SliceStatus& s) { return mine(s.client_id()); });
  KeepIf(
      status->mutable_pending_slices(),
      [&](const proto::PendingSliceStatus& p) { return mine(p.client_id()); });
  KeepIf(status->mutable_why(),
         [&](const proto::WhyEntry& e) { return mine(e.client_id()); });
  KeepIf(status->mutable_graphs(),
         [&](const proto::GraphStatus& g) { return mine(g.client_id()); });
  for (proto::WorkerStatus& w : *status->mutable_workers()) {
    KeepIf(w.mutable_stats()->mutable_clients(),
           [&](const proto::ClientUsage& u) { return mine(u.client_id()); });
  }
}

}  // namespace plexus::web
