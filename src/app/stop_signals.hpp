// SIGINT and SIGTERM during a training run: the first asks for a clean stop after the step (its
// checkpoint saved, exit 130); a second exits at once (a write in progress leaves its temporary,
// which the next start sweeps away).
#pragma once

#include <csignal>
#include <string>

namespace kdflow::app {

// Installs the handlers for its lifetime and restores the previous ones after it.
class StopSignals {
public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // Whether a stop was asked for.
  [[nodiscard]] static bool requested();
  // Asks for a stop as a first signal does (kdflow's Python train() when its callback raises).
  static void request();
  // Interrupted ("nothing was saved or changed") when a stop was asked for before `phase` ends.
  static void check(const std::string& phase);

private:
  struct sigaction old_int_ {
  }, old_term_{};
};

} // namespace kdflow::app
