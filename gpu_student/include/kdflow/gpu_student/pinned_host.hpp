// Page-locked host memory the GPU can DMA from: the ring's slab on a CUDA student. No torch
// headers.
#pragma once

#include "kdflow/core/host_memory.hpp"

namespace kdflow::student {

// mmap + place (NUMA binding) + cudaHostRegister: the pages are placed on the student's NUMA node
// before CUDA pins them, which cudaHostAlloc would not allow. Without a CUDA device (or when the
// registration is refused) this is allocate_locked(), and the kind says which one it got.
HostMemory allocate_pinned_for_device(std::size_t bytes, const PlaceMemory& place = {});

} // namespace kdflow::student
