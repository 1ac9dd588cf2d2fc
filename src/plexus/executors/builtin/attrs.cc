#include "plexus/executors/builtin/attrs.h"

#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"

namespace plexus::builtin {
namespace {

// "an integer", "a number", ... as used in attribute error messages.
const char* KindName(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> const char* {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, int64_t>) return "an integer";
        if constexpr (std::is_same_v<V, double>) return "a float";
        if constexpr (std::is_same_v<V, std::string>) return "a string";
        return "a list of integers";
      },
      value);
}

absl::Status WrongKind(const std::string& key, const char* expected,
                       const AttrValue& got) {
  return absl::InvalidArgumentError(absl::StrCat(
      "attribute '", key, "' must be ", expected, ", got ", KindName(got)));
}

absl::Status Missing(const std::string& key) {
  return absl::InvalidArgumentError(
      absl::StrCat("missing attribute '", key, "'"));
}

}  // namespace

absl::StatusOr<double> GetFloatAttr(const Attrs& attrs, const std::string& key,
                                    std::optional<double> fallback) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    if (fallback.has_value()) return *fallback;
    return Missing(key);
  }
  if (const auto* d = std::get_if<double>(&it->second)) return *d;
  if (const auto* i = std::get_if<int64_t>(&it->second)) {
    return static_cast<double>(*i);
  }
  return WrongKind(key, "a number", it->second);
}

absl::StatusOr<int64_t> GetIntAttr(const Attrs& attrs, const std::string& key,
                                   std::optional<int64_t> fallback) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    if (fallback.has_value()) return *fallback;
    return Missing(key);
  }
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  return WrongKind(key, "an integer", it->second);
}

absl::StatusOr<std::string> GetStringAttr(const Attrs& attrs,
                                          const std::string& key,
                                          std::optional<std::string> fallback) {
  auto it = attrs.find(key);
  if (it == attrs.end()) {
    if (fallback.has_value()) return *fallback;
    return Missing(key);
  }
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  return WrongKind(key, "a string", it->second);
}

absl::StatusOr<std::vector<int64_t>> GetIntsAttr(const Attrs& attrs,
                                                 const std::string& key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return Missing(key);
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) {
    return *v;
  }
  return WrongKind(key, "a list of integers", it->second);
}

}  // namespace plexus::builtin
