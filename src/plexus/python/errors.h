// plexus._core's exceptions: absl::Status errors become Python exceptions
// of a class chosen by their code, with the message intact (Raise), and the
// classes themselves (DefineErrors). The classes are made once, when the
// module is imported (under the GIL), and read-only afterwards.
#pragma once

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace plexus::python {

namespace py = pybind11;

// Raises `s` (not OK) as the Python exception for its code.
[[noreturn]] void Raise(const absl::Status& s);

inline void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Unwrap(absl::StatusOr<T> s) {
  if (!s.ok()) Raise(s.status());
  return std::move(*s);
}

}  // namespace plexus::python
