// CUDA registration of the ring's slab, falling back to mlock without a device.
#include "kdflow/gpu_student/pinned_host.hpp"

#include "kdflow/gpu_student/versions.hpp"

#include <sys/mman.h>

#include "kdflow/core/log.hpp"

#include <string>

#ifdef KD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kdflow::student {

HostMemory allocate_pinned_for_device(std::size_t bytes, const PlaceMemory& place) {
#ifdef KD_HAVE_CUDA
  if (cuda_device_count() > 0) {
    HostMemory locked = allocate_locked(bytes, place);
    void* p = locked.data();
    const std::size_t n = locked.size();
    const cudaError_t st = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (st == cudaSuccess) {
      // Ownership moves to a CUDA-aware release: unregister, then unmap.
      HostMemory pinned(p, n, MemoryKind::cuda_pinned, [](void* q, std::size_t m) {
        if (cudaHostUnregister(q) != cudaSuccess)
          log_warn("slot ring: cudaHostUnregister failed; unmapping anyway");
        munlock(q, m);
        munmap(q, m);
      });
      (void)locked.release();
      return pinned;
    }
    log_warn("slot ring: cudaHostRegister of " + std::to_string(n) + " bytes failed (" +
             cudaGetErrorString(st) + "); the ring is " +
             std::string(memory_kind_name(locked.kind())) + " only");
    (void)cudaGetLastError();
    return locked;
  }
#endif
  return allocate_locked(bytes, place);
}

} // namespace kdflow::student
