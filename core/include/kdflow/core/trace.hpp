// Per-thread spans of the pipeline's work (load, teacher, wait, step) for a Chrome/Perfetto trace.
// Off unless a Recorder is active: a Span then costs one relaxed load. While one is active, each
// span takes a mutex once at its end, which is cheap next to the milliseconds a span stands for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace kdflow::trace {

using Clock = std::chrono::steady_clock;

class Recorder {
public:
  // Keeps at most `per_section` spans of each section (the first ones): a stage alone can run
  // thousands of batches a second, and a trace should stay small enough to open.
  explicit Recorder(std::size_t per_section = 1000);
  // Later spans belong to `section` (one trace "process" per section: a benchmark mode).
  void begin_section(const std::string& section);
  void record(const char* name, std::uint64_t batch, Clock::time_point begin,
              Clock::time_point end);
  [[nodiscard]] std::size_t size() const;
  // Chrome trace event format (JSON object with traceEvents), which ui.perfetto.dev opens.
  void write(const std::filesystem::path& path) const;

private:
  struct Event {
    const char* name; // a string literal
    std::uint64_t batch;
    std::int64_t begin_ns, end_ns;
    int thread, section;
  };
  mutable std::mutex mutex_;
  Clock::time_point origin_;
  std::vector<Event> events_;
  std::vector<std::string> sections_;
  std::vector<std::string> threads_; // thread names; a span's thread id is its index + 1
  int section_ = 0;
  std::size_t per_section_;
  std::vector<std::size_t> kept_, dropped_; // per section
};

// The active recorder (nullptr: tracing off). Set it while no stage is running.
void set_active(Recorder* recorder);
Recorder* active();

// Records [construction, destruction) into the active recorder, if any.
class Span {
public:
  Span(const char* name, std::uint64_t batch) : name_(name), batch_(batch) {
    if (active() != nullptr) begin_ = Clock::now();
  }
  ~Span() { end(); }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  // Ends the span early (idempotent).
  void end() {
    if (begin_ == Clock::time_point{}) return;
    if (Recorder* r = active()) r->record(name_, batch_, begin_, Clock::now());
    begin_ = {};
  }

private:
  const char* name_;
  std::uint64_t batch_;
  Clock::time_point begin_{};
};

} // namespace kdflow::trace
