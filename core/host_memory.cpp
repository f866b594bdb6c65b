// Page-locked host slabs: mmap + madvise(MADV_HUGEPAGE) + mlock, with a pageable fallback that is
// reported rather than silent.
#include "kdflow/core/host_memory.hpp"

#include "kdflow/core/error.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

namespace kdflow {

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
  case MemoryKind::cuda_pinned: return "cuda-pinned";
  case MemoryKind::mlocked: return "mlocked";
  case MemoryKind::pageable: return "pageable";
  }
  return "?";
}

HostMemory::HostMemory(void* data, std::size_t bytes, MemoryKind kind, Release release)
    : data_(data), bytes_(bytes), kind_(kind), release_(std::move(release)) {}

HostMemory::HostMemory(HostMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)),
      kind_(other.kind_), release_(std::move(other.release_)) {}

HostMemory& HostMemory::operator=(HostMemory&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    kind_ = other.kind_;
    release_ = std::move(other.release_);
  }
  return *this;
}

HostMemory::~HostMemory() { reset(); }

void HostMemory::reset() noexcept {
  if (data_ != nullptr && release_) release_(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

HostMemory allocate_locked(std::size_t bytes, const PlaceMemory& place) {
  constexpr std::size_t kPage = 4096;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw_errno(errno, "mmap of " + std::to_string(bytes) + " bytes for the slot ring");
  // Fewer TLB misses when the loaders and the DMA engine stream through large slots.
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  auto unmap = [](void* ptr, std::size_t n) {
    munlock(ptr, n);
    munmap(ptr, n);
  };
  try {
    if (place) place(p, bytes);
  } catch (...) {
    munmap(p, bytes);
    throw;
  }
  if (mlock(p, bytes) == 0) return HostMemory(p, bytes, MemoryKind::mlocked, unmap);

  const int err = errno;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    spdlog::warn("slot ring: mlock of {} bytes refused ({}); the ring stays pageable. Raise "
                 "RLIMIT_MEMLOCK (ulimit -l) to pin it.",
                 bytes, std::strerror(err));
  return HostMemory(p, bytes, MemoryKind::pageable, unmap);
}

} // namespace kdflow
