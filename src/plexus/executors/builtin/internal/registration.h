// How the built-in kernels' signatures reach the catalogue: one function
// per signatures_*.cc file, called once when KernelCatalogue::Global() is
// first built (no static initialisers, so the catalogue is an ordinary
// archive). The bodies' counterparts are in kernel_support.h.
// Not thread-safe: each fills a catalogue not yet shared.
#pragma once

#include "plexus/executors/builtin/catalogue.h"

namespace plexus::builtin::internal {

void RegisterElementwiseSignatures(KernelCatalogue& catalogue);
void RegisterLinalgSignatures(KernelCatalogue& catalogue);
void RegisterLossSignatures(KernelCatalogue& catalogue);
void RegisterMiscSignatures(KernelCatalogue& catalogue);
void RegisterParkSignatures(KernelCatalogue& catalogue);

}  // namespace plexus::builtin::internal
