// One page-aligned slab of host memory for the slot ring, page-locked when the system allows it.
// The kind it got is reported, never hidden: a run says whether its ring is pinned.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <utility>

namespace kdflow {

enum class MemoryKind {
  cuda_pinned, // cudaHostAlloc / cudaHostRegister: DMA-able by the GPU
  mlocked,     // mmap + mlock: page-locked, no GPU registration (CPU student)
  pageable,    // pinning failed (RLIMIT_MEMLOCK): ordinary memory, said once in the log
};

std::string_view memory_kind_name(MemoryKind kind);

// Move-only owner of a slab. The release function is whatever matches the allocation.
class HostMemory {
public:
  using Release = std::function<void(void*, std::size_t)>;

  HostMemory() = default;
  HostMemory(void* data, std::size_t bytes, MemoryKind kind, Release release);
  HostMemory(HostMemory&& other) noexcept;
  HostMemory& operator=(HostMemory&& other) noexcept;
  // Copies would free twice; a slab has exactly one owner.
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  ~HostMemory();

  [[nodiscard]] std::byte* data() const { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t size() const { return bytes_; }
  [[nodiscard]] MemoryKind kind() const { return kind_; }

  // Gives up ownership without freeing (the caller has re-wrapped the same memory).
  void* release() noexcept {
    bytes_ = 0;
    return std::exchange(data_, nullptr);
  }

private:
  void reset() noexcept;

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::pageable;
  Release release_;
};

// Called on the fresh mapping before it is locked, so that its pages are placed (e.g. bound to the
// student's NUMA node by the affinity module) before mlock faults them in.
using PlaceMemory = std::function<void(void*, std::size_t)>;

// mmap (with a transparent-huge-page hint) + place + mlock. When mlock is refused the slab stays
// pageable and a warning is logged once per process.
HostMemory allocate_locked(std::size_t bytes, const PlaceMemory& place = {});

} // namespace kdflow
