// The one rule for how many arguments a call of a program passes, and its
// one message. The server checks every call with it as it routes it (the
// check a hostile or foreign client cannot skip); the C++ client, and the
// Python package through the binding, call it first only to fail fast,
// before a call (or a put of its arguments) is sent.
//
// A pure function: no state, safe from any thread, no locks.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace plexus {

// OK when `given` equals `expected` (the program's inputs); else
// INVALID_ARGUMENT "program 'NAME' takes EXPECTED arguments, got GIVEN".
absl::Status CheckArgumentCount(absl::string_view program_name, size_t expected,
                                size_t given);

}  // namespace plexus
