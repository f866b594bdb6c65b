// Threads that run work inside a oneTBB arena (arena_thread.hpp).
#include "kdflow/core/arena_thread.hpp"

#include <exception>
#include <utility>

namespace kdflow {
namespace {

thread_local bool arena_thread = false;

} // namespace

bool on_arena_thread() { return arena_thread; }

std::thread start_in_arena(oneapi::tbb::task_arena& arena, std::function<void()> fn) {
  return std::thread([&arena, fn = std::move(fn)] {
    arena_thread = true;
    arena.execute(fn);
  });
}

void run_in_arena(oneapi::tbb::task_arena& arena, const std::function<void()>& fn) {
  std::exception_ptr error;
  start_in_arena(arena, [&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
}

} // namespace kdflow
