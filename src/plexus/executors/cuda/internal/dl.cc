#include "plexus/executors/cuda/internal/dl.h"

#include <filesystem>

namespace plexus::cuda::internal {

void* OpenFirst(const std::vector<std::string>& names,
                const std::vector<std::string>& dirs, std::string* path,
                std::vector<std::string>* tried) {
  for (const std::string& name : names) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *path = name;
      return h;
    }
    tried->push_back(name);
  }
  for (const std::string& dir : dirs) {
    for (const std::string& name : names) {
      std::string p = (std::filesystem::path(dir) / name).string();
      if (void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        *path = p;
        return h;
      }
      tried->push_back(p);
    }
  }
  return nullptr;
}

}  // namespace plexus::cuda::internal
