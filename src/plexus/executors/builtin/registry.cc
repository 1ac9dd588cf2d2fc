#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel.h"

namespace plexus::builtin {

KernelRegistry& KernelRegistry::Global() {
  // Never destroyed: kernels may be looked up from other static destructors.
  static KernelRegistry* registry = new KernelRegistry();
  return *registry;
}

void KernelRegistry::Register(const std::string& name,
                              std::unique_ptr<Kernel> kernel, KernelDoc doc) {
  if (Find(name) != nullptr || kernel == nullptr || doc.summary.empty()) {
    std::fprintf(stderr, "plexus: kernel '%s' registered %s\n", name.c_str(),
                 kernel == nullptr     ? "as null"
                 : doc.summary.empty() ? "without a summary"
                                       : "twice");
    std::abort();
  }
  kernels_.push_back({name, std::move(kernel), std::move(doc)});
}

const Kernel* KernelRegistry::Find(const std::string& name) const {
  for (const Entry& entry : kernels_) {
    if (entry.name == name) return entry.kernel.get();
  }
  return nullptr;
}

const KernelDoc* KernelRegistry::FindDoc(const std::string& name) const {
  for (const Entry& entry : kernels_) {
    if (entry.name == name) return &entry.doc;
  }
  return nullptr;
}

std::vector<std::string> KernelRegistry::Names() const {
  std::vector<std::string> names;
  names.reserve(kernels_.size());
  for (const Entry& entry : kernels_) names.push_back(entry.name);
  std::sort(names.begin(), names.end());
  return names;
}

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
