// Fault injection for the tests: a test installs a hook that every pipeline stage calls once per
// batch, and the hook throws or stalls where the test wants a fault. Nothing in kdflow installs
// one, and no flag, configuration key or environment variable reaches it.
#pragma once

#include <atomic>
#include <cstdint>

namespace kdflow {
class SlotRing;
} // namespace kdflow

namespace kdflow::fault {

enum class Site { loader, teacher, student };

// Called with the stage, the run's batch number and the ring (a stall can wait for its close, as
// a stage blocked on the ring would).
using Hook = void (*)(Site site, std::uint64_t batch, const SlotRing& ring);

namespace detail {
extern std::atomic<Hook> hook;
} // namespace detail

// Installs `hook` (nullptr: none) for every stage from now on.
inline void install(Hook hook) { detail::hook.store(hook, std::memory_order_release); }

// The stages' call: one atomic load when no test installed a hook.
inline void at(Site site, std::uint64_t batch, const SlotRing& ring) {
  if (const Hook hook = detail::hook.load(std::memory_order_acquire)) hook(site, batch, ring);
}

} // namespace kdflow::fault
