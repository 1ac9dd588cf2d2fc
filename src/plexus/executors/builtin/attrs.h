// Reading a kernel's attributes (Attrs, common/types.h), with defaults and
// clear errors ("attribute 'lr' must be a number, got a string"). Shared by
// the kernels' signatures (catalogue.h) and bodies (kernel.h), so both read
// an attribute the same way. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/common/types.h"

namespace plexus::builtin {

absl::StatusOr<double> GetFloatAttr(const Attrs& attrs, const std::string& key,
                                    std::optional<double> fallback = {});
absl::StatusOr<int64_t> GetIntAttr(const Attrs& attrs, const std::string& key,
                                   std::optional<int64_t> fallback = {});
absl::StatusOr<std::string> GetStringAttr(
    const Attrs& attrs, const std::string& key,
    std::optional<std::string> fallback = {});
absl::StatusOr<std::vector<int64_t>> GetIntsAttr(const Attrs& attrs,
                                                 const std::string& key);

}  // namespace plexus::builtin
