#include "plexus/executors/builtin/catalogue.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "plexus/executors/builtin/internal/registration.h"

namespace plexus::builtin {

const KernelCatalogue& KernelCatalogue::Global() {
  // Never destroyed: signatures may be looked up from static destructors.
  static const KernelCatalogue* catalogue = [] {
    auto* c = new KernelCatalogue();
    internal::RegisterElementwiseSignatures(*c);
    internal::RegisterLinalgSignatures(*c);
    internal::RegisterLossSignatures(*c);
    internal::RegisterMiscSignatures(*c);
    internal::RegisterParkSignatures(*c);
    return c;
  }();
  return *catalogue;
}

void KernelCatalogue::Register(const std::string& name,
                               std::unique_ptr<KernelSignature> signature,
                               KernelDoc doc) {
  if (Find(name) != nullptr || signature == nullptr || doc.summary.empty()) {
    std::fprintf(stderr, "plexus: kernel '%s' registered %s\n", name.c_str(),
                 signature == nullptr  ? "as null"
                 : doc.summary.empty() ? "without a summary"
                                       : "twice");
    std::abort();
  }
  entries_.push_back({name, std::move(signature), std::move(doc)});
}

const KernelSignature* KernelCatalogue::Find(const std::string& name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) return entry.signature.get();
  }
  return nullptr;
}

const KernelDoc* KernelCatalogue::FindDoc(const std::string& name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) return &entry.doc;
  }
  return nullptr;
}

std::vector<std::string> KernelCatalogue::Names() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const Entry& entry : entries_) names.push_back(entry.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace plexus::builtin
