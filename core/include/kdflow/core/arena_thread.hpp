// Work run inside a oneTBB task arena by a thread kdflow starts for it, not by oneTBB's global
// worker pool. A task enqueue()d into an arena runs only when oneTBB's market sends a worker there,
// and a market that fails to (oneTBB 2021.8 once left a replica's arena without one while an idle
// worker slept, so its stage never started and the run hung) would hang the run. A thread that
// calls task_arena::execute() takes a free slot of the arena itself (an arena with no slot reserved
// for such threads still lets them into its free ones), so a stage's work starts whether or not a
// worker ever comes; more workers, where the arena has slots for them, only add threads.
// The arena's observer (affinity::PinnedArena) pins and names such a thread as one of its workers.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <functional>
#include <thread>

namespace kdflow {

// Whether the calling thread was started by start_in_arena() (set before it enters the arena).
[[nodiscard]] bool on_arena_thread();

// A new thread that runs `fn` inside `arena` (task_arena::execute: in a free slot of it, or, with
// every slot taken, as a task of the arena its threads run) and ends. The caller joins it;
// an exception from `fn` ends the process (std::thread), so `fn` catches what it may throw.
[[nodiscard]] std::thread start_in_arena(oneapi::tbb::task_arena& arena, std::function<void()> fn);

// Runs `fn` inside `arena` on a thread of the arena (start_in_arena) and waits for it; rethrows
// what `fn` throws.
void run_in_arena(oneapi::tbb::task_arena& arena, const std::function<void()>& fn);

} // namespace kdflow
