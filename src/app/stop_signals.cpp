// The stop signals of a training run (stop_signals.hpp).
#include "stop_signals.hpp"

#include "kdflow/core/error.hpp"

#include <unistd.h>

#include <atomic>

#include <fmt/format.h>

namespace kdflow::app {
namespace {

std::atomic<int> g_signals{0};

extern "C" void on_stop_signal(int) {
  if (g_signals.fetch_add(1) >= 1) {
    static const char message[] = "kdflow: a second signal: exiting now, without a checkpoint\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(kExitInterrupted);
  }
}

} // namespace

StopSignals::StopSignals() {
  g_signals.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &old_int_);
  sigaction(SIGTERM, &action, &old_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

bool StopSignals::requested() { return g_signals.load() > 0; }

void StopSignals::request() {
  int none = 0;
  g_signals.compare_exchange_strong(none, 1);
}

void StopSignals::check(const std::string& phase) {
  if (requested())
    throw Interrupted(fmt::format("interrupted during {}: nothing was saved or changed", phase));
}

} // namespace kdflow::app
