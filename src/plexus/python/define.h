// The parts of plexus._core, each registered by one function (binding.cc
// calls them in this order when the module is imported, under the GIL):
// the exception classes first, as every other part raises them.
#pragma once

#include <pybind11/pybind11.h>

namespace plexus::python {

namespace py = pybind11;

void DefineErrors(py::module_& m);            // errors.cc
void DefineSlice(py::module_& m);             // objects.cc
void DefineProgram(py::module_& m);           // objects.cc
void DefineFuture(py::module_& m);            // objects.cc
void DefineGraph(py::module_& m);             // objects.cc
void DefineTransferProgress(py::module_& m);  // objects.cc
void DefineClient(py::module_& m);            // client_binding.cc
void DefineClusterFunctions(py::module_& m);  // functions.cc
void DefineKernelFunctions(py::module_& m);   // functions.cc

}  // namespace plexus::python
