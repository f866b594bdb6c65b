// Slot ring benchmark. Peers in the same run, each circulating the same number of slot indices
// between one producer and one consumer on different cores (a free queue and a ready queue, as a
// slot pool built on queues would): boost::lockfree::spsc_queue, moodycamel::ReaderWriterQueue and
// a mutex + condition variable queue. Then 1 MiB slots filled by one thread and drained by another,
// against both copies done in one thread (ideal: 2x). Prints JSON; --json F writes it too.
#include "bench_util.hpp"

#include "kdflow/core/slot_ring.hpp"

#include <boost/lockfree/spsc_queue.hpp>
#include <readerwriterqueue/readerwriterqueue.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace kdflow::bench {
namespace {

constexpr std::uint32_t kSlots = 8;

// Mutex + condition variable queue: the peer that every lock-free structure must beat.
class MutexQueue {
public:
  void push(std::uint32_t v) {
    {
      std::lock_guard lock(m_);
      q_.push_back(v);
    }
    cv_.notify_one();
  }
  std::uint32_t pop() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return !q_.empty(); });
    const auto v = q_.front();
    q_.pop_front();
    return v;
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::uint32_t> q_;
};

// Spins then yields: what a caller of a non-blocking queue has to write itself.
template <typename TryPop>
std::uint32_t pop_spinning(TryPop&& try_pop) {
  std::uint32_t v = 0;
  while (!try_pop(v)) std::this_thread::yield();
  return v;
}

// Passes `n` batches through a pool of kSlots indices; `fill(i)` and `drain(i)` work on slot i
// between the hand-offs. Returns elapsed seconds.
template <typename Queue, typename Push, typename Pop>
double run_index_pool(std::uint64_t n, Push push, Pop pop,
                      const std::function<void(std::uint32_t)>& fill = {},
                      const std::function<void(std::uint32_t)>& drain = {}) {
  Queue free_q, ready_q;
  for (std::uint32_t i = 0; i < kSlots; ++i) push(free_q, i);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread producer([&] {
    pin_to_allowed_cpu(0);
    for (std::uint64_t b = 0; b < n; ++b) {
      const std::uint32_t i = pop(free_q);
      if (fill) fill(i);
      push(ready_q, i);
    }
  });
  pin_to_allowed_cpu(1);
  for (std::uint64_t b = 0; b < n; ++b) {
    const std::uint32_t i = pop(ready_q);
    if (drain) drain(i);
    push(free_q, i);
  }
  producer.join();
  return seconds_since(t0);
}

SlotRing make_ring(std::size_t payload_bytes) {
  SlotLayout layout({{"payload", DType::u8, {static_cast<std::int64_t>(payload_bytes)}}});
  HostMemory mem = allocate_locked(kSlots * layout.slot_bytes());
  return SlotRing(std::move(layout), kSlots, std::move(mem));
}

// The ring with empty payloads: producer claims and publishes, consumer claims and releases.
double run_ring(std::uint64_t n) {
  SlotRing ring = make_ring(64);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread producer([&] {
    pin_to_allowed_cpu(0);
    for (std::uint64_t b = 0; b < n; ++b) {
      auto s = ring.acquire_free(b);
      ring.publish(*s, SlotState::filling, SlotState::ready);
    }
  });
  pin_to_allowed_cpu(1);
  for (std::uint64_t b = 0; b < n; ++b) ring.release(*ring.acquire_ready(b));
  producer.join();
  return seconds_since(t0);
}

// 1 MiB slots: the producer fills each slot from its source buffer, the consumer copies it out.
double run_ring_copies(std::uint64_t n, std::size_t bytes, const std::vector<std::byte>& src,
                       std::vector<std::byte>& dst) {
  SlotRing ring = make_ring(bytes);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread producer([&] {
    pin_to_allowed_cpu(0);
    for (std::uint64_t b = 0; b < n; ++b) {
      auto s = ring.acquire_free(b);
      std::memcpy(s->region<std::byte>(0).data(), src.data(), bytes);
      ring.publish(*s, SlotState::filling, SlotState::ready);
    }
  });
  pin_to_allowed_cpu(1);
  for (std::uint64_t b = 0; b < n; ++b) {
    auto s = ring.acquire_ready(b);
    std::memcpy(dst.data(), s->region<std::byte>(0).data(), bytes);
    ring.release(*s);
  }
  producer.join();
  return seconds_since(t0);
}

// Both threads copy 1 MiB per slot with no hand-off at all: what this machine's cores and memory
// allow two copying threads, the ceiling for any pipeline of two copies.
double run_independent_copies(std::uint64_t n, std::size_t bytes, const std::vector<std::byte>& src,
                              std::vector<std::byte>& dst) {
  std::vector<std::byte> slot_a(bytes), slot_b(bytes), dst_b(bytes);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread other([&] {
    pin_to_allowed_cpu(0);
    for (std::uint64_t b = 0; b < n; ++b) std::memcpy(slot_b.data(), src.data(), bytes);
  });
  pin_to_allowed_cpu(1);
  for (std::uint64_t b = 0; b < n; ++b) std::memcpy(dst.data(), slot_a.data(), bytes);
  other.join();
  return seconds_since(t0);
}

// Both copies in one thread through the same slots: the serial baseline.
double run_serial_copies(std::uint64_t n, std::size_t bytes, const std::vector<std::byte>& src,
                         std::vector<std::byte>& dst) {
  SlotRing ring = make_ring(bytes);
  pin_to_allowed_cpu(1);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t b = 0; b < n; ++b) {
    std::byte* slot =
        ring.slab() + (b % kSlots) * ring.layout().slot_bytes() + ring.layout().regions()[0].offset;
    std::memcpy(slot, src.data(), bytes);
    std::memcpy(dst.data(), slot, bytes);
  }
  return seconds_since(t0);
}

} // namespace
} // namespace kdflow::bench

int main(int argc, char** argv) {
  using namespace kdflow::bench;
  const std::uint64_t n = 2'000'000;
  const int warmup = 1, reps = 5;

  using Boost = boost::lockfree::spsc_queue<std::uint32_t, boost::lockfree::capacity<kSlots + 1>>;
  using Rwq = moodycamel::ReaderWriterQueue<std::uint32_t>;
  const double t_ring = median_seconds(warmup, reps, [&] { return run_ring(n); });
  const double t_boost = median_seconds(warmup, reps, [&] {
    return run_index_pool<Boost>(
        n,
        [](Boost& q, std::uint32_t v) {
          while (!q.push(v)) std::this_thread::yield();
        },
        [](Boost& q) { return pop_spinning([&](std::uint32_t& v) { return q.pop(v); }); });
  });
  const double t_rwq = median_seconds(warmup, reps, [&] {
    return run_index_pool<Rwq>(
        n, [](Rwq& q, std::uint32_t v) { q.enqueue(v); },
        [](Rwq& q) { return pop_spinning([&](std::uint32_t& v) { return q.try_dequeue(v); }); });
  });
  const double t_mutex = median_seconds(warmup, reps, [&] {
    return run_index_pool<MutexQueue>(
        n, [](MutexQueue& q, std::uint32_t v) { q.push(v); },
        [](MutexQueue& q) { return q.pop(); });
  });

  const std::size_t mib = 1 << 20;
  const std::uint64_t n_big = 2000;
  std::vector<std::byte> src(mib, std::byte{7}), dst(mib);
  const double t_pipelined =
      median_seconds(warmup, reps, [&] { return run_ring_copies(n_big, mib, src, dst); });
  const double t_serial =
      median_seconds(warmup, reps, [&] { return run_serial_copies(n_big, mib, src, dst); });
  // The same two copies handed off through the boost queue pool: the peer pipeline.
  std::vector<std::byte> pool(kSlots * mib);
  const double t_boost_copies = median_seconds(warmup, reps, [&] {
    return run_index_pool<Boost>(
        n_big,
        [](Boost& q, std::uint32_t v) {
          while (!q.push(v)) std::this_thread::yield();
        },
        [](Boost& q) { return pop_spinning([&](std::uint32_t& v) { return q.pop(v); }); },
        [&](std::uint32_t i) { std::memcpy(pool.data() + i * mib, src.data(), mib); },
        [&](std::uint32_t i) { std::memcpy(dst.data(), pool.data() + i * mib, mib); });
  });
  const double t_independent =
      median_seconds(warmup, reps, [&] { return run_independent_copies(n_big, mib, src, dst); });
  const double speedup = t_serial / t_pipelined;
  const double machine_speedup = t_serial / t_independent;

  const auto rate = [&](double t) { return static_cast<double>(n) / t; };
  nlohmann::json result = {
      {"benchmark", "ring"},
      {"cpus", std::thread::hardware_concurrency()},
      {"slots", kSlots},
      {"repetitions", reps},
      {"handoffs", n},
      {"handoffs_per_s",
       {{"kdflow_ring", rate(t_ring)},
        {"boost_spsc_queue", rate(t_boost)},
        {"moodycamel_rwq", rate(t_rwq)},
        {"mutex_cv_queue", rate(t_mutex)}}},
      {"ring_vs",
       {{"boost_spsc_queue", t_boost / t_ring},
        {"moodycamel_rwq", t_rwq / t_ring},
        {"mutex_cv_queue", t_mutex / t_ring}}},
      {"target_handoffs_per_s", 10e6},
      {"copy_1mib",
       {{"slots_per_s_pipelined", n_big / t_pipelined},
        {"slots_per_s_serial", n_big / t_serial},
        {"slots_per_s_boost_spsc_pipelined", n_big / t_boost_copies},
        {"ring_vs_boost_spsc_pipelined", t_boost_copies / t_pipelined},
        {"speedup", speedup},
        {"fraction_of_ideal_2x", speedup / 2.0},
        {"independent_threads_speedup", machine_speedup},
        {"fraction_of_independent_threads", speedup / machine_speedup},
        {"target_fraction", 0.9}}},
  };
  emit(result, json_path(argc, argv));
  return 0;
}
