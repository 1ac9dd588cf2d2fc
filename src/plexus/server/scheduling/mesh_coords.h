// Row-major coordinates of a slice's virtual devices in its mesh: virtual
// device v of a mesh of shape `mesh` is at CoordsOf(v, mesh), and
// IndexOf(CoordsOf(v, mesh), mesh) == v.
#pragma once

#include <cstdint>
#include <vector>

namespace plexus {

inline int IndexOf(const std::vector<int32_t>& coords,
                   const std::vector<int32_t>& mesh) {
  int index = 0;
  for (size_t a = 0; a < mesh.size(); ++a) index = index * mesh[a] + coords[a];
  return index;
}

inline std::vector<int32_t> CoordsOf(int index,
                                     const std::vector<int32_t>& mesh) {
  std::vector<int32_t> coords(mesh.size());
  for (size_t a = mesh.size(); a-- > 0;) {
    coords[a] = index % mesh[a];
    index /= mesh[a];
  }
  return coords;
}

}  // namespace plexus
