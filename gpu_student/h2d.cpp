// H2D bandwidth: the feeder's path against cudaMemcpyAsync from cudaHostAlloc memory.
#include "kdflow/gpu_student/h2d.hpp"

#include "kdflow/gpu_student/pinned_host.hpp"
#include "slot_feeder.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace kdflow::student {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds for `copies` slots through a fresh ring and feeder, after one warm-up lap.
double time_slots(const SlotLayout& layout, std::uint32_t slots, std::uint64_t copies,
                  std::string& memory_kind) {
  SlotRing ring(layout, slots, allocate_pinned_for_device(slots * layout.slot_bytes()));
  memory_kind = memory_kind_name(ring.memory_kind());
  const torch::Device cuda(torch::kCUDA, 0);
  SlotFeeder feeder(ring, cuda);
  const std::uint64_t total = slots + copies;
  std::thread producer([&] {
    for (std::uint64_t b = 0; b < total; ++b) {
      auto s = ring.acquire_free(b);
      if (!s) return;
      s->header().samples = 1;
      ring.publish(*s, SlotState::filling, SlotState::ready);
    }
  });
  Clock::time_point t0;
  try {
    for (std::uint64_t b = 0; b < total; ++b) {
      if (b == slots) {
        feeder.drain();
        t0 = Clock::now();
      }
      if (!feeder.next(b)) break;
      feeder.finish_step();
    }
    feeder.drain();
    C10_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (...) {
    ring.close(); // the producer stops waiting for slots, and can be joined
    producer.join();
    throw;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  producer.join();
  return seconds;
}

// Seconds for `copies` back-to-back cudaMemcpyAsync of `bytes` each, cycling over `slots` buffers.
double time_memcpy(std::size_t bytes, std::uint32_t slots, std::uint64_t copies) {
  void* host = nullptr;
  void* device = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&host, slots * bytes, cudaHostAllocDefault));
  C10_CUDA_CHECK(cudaMalloc(&device, slots * bytes));
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto* h = static_cast<std::byte*>(host);
  auto* d = static_cast<std::byte*>(device);
  const auto run = [&](std::uint64_t n) {
    for (std::uint64_t k = 0; k < n; ++k) {
      const std::size_t at = (k % slots) * bytes;
      C10_CUDA_CHECK(cudaMemcpyAsync(d + at, h + at, bytes, cudaMemcpyHostToDevice, stream));
    }
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  run(slots);
  const auto t0 = Clock::now();
  run(copies);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  C10_CUDA_CHECK(cudaStreamDestroy(stream));
  C10_CUDA_CHECK(cudaFree(device));
  C10_CUDA_CHECK(cudaFreeHost(host));
  return seconds;
}

} // namespace

std::optional<H2dBandwidth> measure_h2d(const SlotLayout& layout, std::uint32_t slots,
                                        std::uint64_t copies, int repeats) {
  if (!torch::cuda::is_available()) return std::nullopt;
  c10::cuda::CUDAGuard guard(0);
  H2dBandwidth out;
  out.bytes = layout.slot_bytes();
  out.copies = copies;
  const double gb = static_cast<double>(out.bytes) * static_cast<double>(copies) / 1e9;
  std::vector<double> ring_rates, memcpy_rates;
  // Interleaved, so that both sides see the same state of a shared machine.
  for (int r = 0; r < std::max(1, repeats); ++r) {
    ring_rates.push_back(gb / time_slots(layout, slots, copies, out.slot_memory));
    memcpy_rates.push_back(gb / time_memcpy(out.bytes, slots, copies));
  }
  out.slots_gb_per_s = median(ring_rates);
  out.memcpy_gb_per_s = median(memcpy_rates);
  return out;
}

} // namespace kdflow::student
