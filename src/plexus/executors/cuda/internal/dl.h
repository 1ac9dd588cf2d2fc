// Internal to executors/cuda: how CudaApi and NcclApi open their libraries
// and bind their symbols (dlopen/dlsym), one rule for both.
#pragma once

#include <dlfcn.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace plexus::cuda::internal {

// dlopen()s the first of `names` found, by soname and then in each of
// `dirs`; `path` gets the one opened, `tried` every one that was not.
void* OpenFirst(const std::vector<std::string>& names,
                const std::vector<std::string>& dirs, std::string* path,
                std::vector<std::string>* tried);

// Binds `symbol` of `lib` to `fn`; an error names `library` ("CUDA",
// "NCCL") and the symbol.
template <typename F>
absl::Status Bind(void* lib, const char* library, const char* symbol, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, symbol));
  if (*fn == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(library, ": the library has no ", symbol));
  }
  return absl::OkStatus();
}

}  // namespace plexus::cuda::internal
