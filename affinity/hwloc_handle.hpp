// One RAII owner per hwloc handle (topology, bitmap), private to the affinity module.
#pragma once

#include "kdflow/affinity/topology.hpp"

#include <hwloc.h>

#include <memory>

namespace kdflow::affinity {

struct BitmapDeleter {
  void operator()(hwloc_bitmap_t b) const { hwloc_bitmap_free(b); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

inline Bitmap make_bitmap() { return Bitmap(hwloc_bitmap_alloc()); }
inline Bitmap bitmap_of(const CpuList& cpus) {
  Bitmap b = make_bitmap();
  for (const int c : cpus) hwloc_bitmap_set(b.get(), static_cast<unsigned>(c));
  return b;
}
inline CpuList cpus_of(hwloc_const_bitmap_t b) {
  CpuList out;
  for (int i = hwloc_bitmap_first(b); i != -1; i = hwloc_bitmap_next(b, i)) out.push_back(i);
  return out;
}

struct Topology::Handle {
  hwloc_topology_t topo = nullptr;
  bool synthetic = false;
  ~Handle() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
};

} // namespace kdflow::affinity
