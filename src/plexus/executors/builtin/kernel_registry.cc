#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin {

absl::StatusOr<std::unique_ptr<KernelRegistry>> KernelRegistry::Create(
    const KernelCatalogue& catalogue, KernelBodies bodies) {
  std::sort(bodies.begin(), bodies.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < bodies.size(); ++i) {
    if (bodies[i].first == bodies[i - 1].first) {
      return absl::InternalError(
          absl::StrCat("kernel '", bodies[i].first, "' has two bodies"));
    }
  }
  std::unique_ptr<KernelRegistry> registry(new KernelRegistry());
  auto body = bodies.begin();
  for (const std::string& name : catalogue.Names()) {
    if (body != bodies.end() && body->first < name) break;  // not catalogued
    if (body == bodies.end() || body->first != name) {
      return absl::InternalError(absl::StrCat(
          "kernel '", name, "' is in the catalogue but has no body"));
    }
    if (body->second == nullptr) {
      return absl::InternalError(
          absl::StrCat("kernel '", name, "' has a null body"));
    }
    registry->kernels_.emplace_back(
        name, Kernel(catalogue.Find(name), std::move(body->second)));
    ++body;
  }
  if (body != bodies.end()) {
    return absl::InternalError(absl::StrCat(
        "kernel '", body->first, "' has a body but is not in the catalogue"));
  }
  return registry;
}

absl::StatusOr<const KernelRegistry*> KernelRegistry::Builtin() {
  // Never destroyed: kernels may be looked up from static destructors.
  static const auto* const registry =
      new absl::StatusOr<std::unique_ptr<KernelRegistry>>([] {
        KernelBodies bodies;
        internal::AddElementwiseBodies(bodies);
        internal::AddLinalgBodies(bodies);
        internal::AddLossBodies(bodies);
        internal::AddMiscBodies(bodies);
        internal::AddParkBodies(bodies);
        return Create(KernelCatalogue::Global(), std::move(bodies));
      }());
  if (!registry->ok()) return registry->status();
  return registry->value().get();
}

const KernelRegistry& KernelRegistry::Global() {
  absl::StatusOr<const KernelRegistry*> registry = Builtin();
  if (!registry.ok()) {
    std::fprintf(stderr, "plexus: %s\n",
                 std::string(registry.status().message()).c_str());
    std::abort();
  }
  return **registry;
}

const Kernel* KernelRegistry::Find(const std::string& name) const {
  auto it = std::lower_bound(
      kernels_.begin(), kernels_.end(), name,
      [](const auto& entry, const std::string& n) { return entry.first < n; });
  if (it == kernels_.end() || it->first != name) return nullptr;
  return &it->second;
}

std::vector<std::string> KernelRegistry::Names() const {
  std::vector<std::string> names;
  names.reserve(kernels_.size());
  for (const auto& entry : kernels_) names.push_back(entry.first);
  return names;
}

}  // namespace plexus::builtin
