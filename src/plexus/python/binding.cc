// plexus._core: the Python binding of the C++ client. Thin: the Pythonic
// API (futures like jax.Array, shardings like PartitionSpec) lives in
// python/plexus/. Every call that blocks or waits releases the GIL.
// absl::Status errors become Python exceptions with the message intact
// (errors.h). Each part of the module is registered by its own function
// (define.h).
#include <pybind11/pybind11.h>

#include "plexus/python/define.h"

PYBIND11_MODULE(_core, m) {
  using namespace plexus::python;
  m.doc() = "Plexus C++ client (internal; use the plexus package)";
  DefineErrors(m);
  DefineSlice(m);
  DefineProgram(m);
  DefineFuture(m);
  DefineGraph(m);
  DefineTransferProgress(m);
  DefineClient(m);
  DefineClusterFunctions(m);
  DefineKernelFunctions(m);
}
