// What a training run shows while it runs: the live line on a terminal (at most 4 updates a
// second, cleared before a permanent line), and the clock text of its ETA.
#pragma once

#include "kdflow/core/log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace kdflow::app {

// h:mm:ss
inline std::string clock_text(double seconds) {
  const auto s = static_cast<long>(std::max(0.0, seconds));
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

class Progress {
  using Clock = std::chrono::steady_clock;

public:
  explicit Progress(bool terminal) : terminal_(terminal) {}
  ~Progress() { finish(); }
  [[nodiscard]] bool terminal() const { return terminal_; }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // The live line on a terminal, at most 4 updates a second: the caller formats it only when due().
  [[nodiscard]] bool due() {
    if (!terminal_) return false;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(250)) return false;
    last_ = now;
    return true;
  }
  void show(const std::string& line) {
    fmt::print(stderr, "\r\033[K{}", line);
    std::fflush(stderr);
    shown_ = true;
  }
  // A permanent line (the live line is cleared first).
  void line(const std::string& text) {
    finish();
    log_info(text);
  }
  void finish() {
    if (!shown_) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

private:
  bool terminal_;
  bool shown_ = false;
  Clock::time_point last_{};
};

} // namespace kdflow::app
