#include "plexus/server/model/tenants.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace plexus {
namespace {

absl::Status ParsePolicy(const nlohmann::json& j, const std::string& who,
                         TenantPolicy* policy) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenants: ", who, " must be an object"));
  }
  for (const auto& item : j.items()) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang).
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenants: ", who, ".", key, " ", why, " (got ", value.dump(), ")"));
    };
    if (key == "weight") {
      if (!value.is_number() || value.get<double>() <= 0) {
        return bad("must be a number > 0");
      }
      policy->weight = value.get<double>();
    } else if (key == "priority") {
      if (!value.is_number_integer() ||
          std::abs(value.get<int64_t>()) > TenantPolicy::kMaxPriority) {
        return bad(absl::StrCat("must be an integer from -",
                                TenantPolicy::kMaxPriority, " to ",
                                TenantPolicy::kMaxPriority));
      }
      policy->priority = static_cast<int32_t>(value.get<int64_t>());
    } else if (key == "max_devices" || key == "max_calls_in_flight" ||
               key == "max_bytes") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return bad("must be an integer >= 0");
      }
      const int64_t v = value.get<int64_t>();
      if (key == "max_bytes") {
        policy->max_bytes = v;
      } else if (v > (int64_t{1} << 30)) {
        return bad("is too large");
      } else if (key == "max_devices") {
        policy->max_devices = static_cast<int32_t>(v);
      } else {
        policy->max_calls_in_flight = v == 0
                                          ? TenantPolicy::kDefaultCallsInFlight
                                          : static_cast<int32_t>(v);
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("tenants: ", who, " has an unknown field \"", key,
                       "\" (known: weight, priority, max_devices, max_bytes, "
                       "max_calls_in_flight)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TenantTable> TenantTable::FromJson(absl::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        "tenants: not a JSON object ({\"default\": {...}, \"tenants\": "
        "{name: {...}}})");
  }
  TenantTable table;
  for (const auto& [key, value] : j.items()) {
    if (key == "default") {
      absl::Status s = ParsePolicy(value, "default", &table.default_);
      if (!s.ok()) return s;
    } else if (key != "tenants") {
      return absl::InvalidArgumentError(
          absl::StrCat("tenants: unknown top-level field \"", key,
                       "\" (known: default, tenants)"));
    }
  }
  if (j.contains("tenants")) {
    const nlohmann::json& tenants = j["tenants"];
    if (!tenants.is_object()) {
      return absl::InvalidArgumentError(
          "tenants: \"tenants\" must map tenant names to policies");
    }
    for (const auto& [name, value] : tenants.items()) {
      if (name.empty()) {
        return absl::InvalidArgumentError("tenants: a tenant name is empty");
      }
      TenantPolicy policy = table.default_;  // unset fields inherit
      absl::Status s = ParsePolicy(value, name, &policy);
      if (!s.ok()) return s;
      table.tenants_[name] = policy;
    }
  }
  return table;
}

absl::StatusOr<TenantTable> TenantTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("tenants: cannot read the file ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<TenantTable> table = FromJson(text.str());
  if (!table.ok()) {
    return absl::Status(table.status().code(),
                        absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

const TenantPolicy& TenantTable::For(absl::string_view tenant) const {
  auto it = tenants_.find(std::string(tenant));
  return it == tenants_.end() ? default_ : it->second;
}

}  // namespace plexus
