// Trace spans (trace.hpp): one relaxed load when no Recorder is active; when one is, each span is
// recorded at its end under the recorder's mutex and written once as Chrome trace-event JSON.
#include "kdflow/core/trace.hpp"

#include "kdflow/core/atomic_file.hpp"

#include <pthread.h>

#include <algorithm>

#include <fmt/format.h>

namespace kdflow::trace {
namespace {

std::atomic<Recorder*> g_active{nullptr};

// Minimal JSON string escaping for thread and section names.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\')
      out += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    else
      out += c;
  }
  return out + "\"";
}

} // namespace

void set_active(Recorder* recorder) { g_active.store(recorder, std::memory_order_release); }
Recorder* active() { return g_active.load(std::memory_order_acquire); }

Recorder::Recorder(std::size_t per_section)
    : origin_(Clock::now()), sections_{"kdflow"}, per_section_(per_section), kept_(1), dropped_(1) {
}

void Recorder::begin_section(const std::string& section) {
  std::lock_guard lock(mutex_);
  sections_.push_back(section);
  kept_.push_back(0);
  dropped_.push_back(0);
  section_ = static_cast<int>(sections_.size()) - 1;
}

void Recorder::record(const char* name, std::uint64_t batch, Clock::time_point begin,
                      Clock::time_point end) {
  // Threads are told apart by their names (kd-loader-0, kd-teacher-1, kd-student): oneTBB's
  // workers move between arenas, and PinnedArena renames them as they enter one.
  char thread_name[32] = "thread";
  pthread_getname_np(pthread_self(), thread_name, sizeof thread_name);
  std::lock_guard lock(mutex_);
  const auto section = static_cast<std::size_t>(section_);
  if (kept_[section] >= per_section_) {
    ++dropped_[section];
    return;
  }
  ++kept_[section];
  const auto it = std::find(threads_.begin(), threads_.end(), thread_name);
  const int id = static_cast<int>(it - threads_.begin()) + 1;
  if (it == threads_.end()) threads_.emplace_back(thread_name);
  const auto ns = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  };
  events_.push_back({name, batch, ns(begin), ns(end), id, section_});
}

std::size_t Recorder::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

void Recorder::write(const std::filesystem::path& path) const {
  std::lock_guard lock(mutex_);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  const auto add = [&](const std::string& event) {
    out += first ? "" : ",\n";
    out += event;
    first = false;
  };
  // Metadata: one process per section, its threads named as the OS knows them (kd-loader-0, ...).
  std::vector<std::vector<bool>> named(sections_.size(), std::vector<bool>(threads_.size() + 1));
  for (std::size_t s = 0; s < sections_.size(); ++s) {
    add(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"tid":0,"args":{{"name":{}}}}})",
                    s + 1, quoted(sections_[s])));
    add(fmt::format(R"({{"ph":"M","name":"process_sort_index","pid":{},"tid":0,)"
                    R"("args":{{"sort_index":{}}}}})",
                    s + 1, s));
    if (dropped_[s] > 0)
      add(fmt::format(R"({{"ph":"M","name":"process_labels","pid":{},"tid":0,)"
                      R"("args":{{"labels":"first {} spans kept, {} more not recorded"}}}})",
                      s + 1, kept_[s], dropped_[s]));
  }
  for (const Event& e : events_) {
    auto seen = named[static_cast<std::size_t>(e.section)][static_cast<std::size_t>(e.thread)];
    if (!seen) {
      add(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})",
                      e.section + 1, e.thread,
                      quoted(threads_[static_cast<std::size_t>(e.thread) - 1])));
      seen = true;
    }
    add(fmt::format(R"({{"ph":"X","cat":"kdflow","name":"{}","pid":{},"tid":{},"ts":{:.3f},)"
                    R"("dur":{:.3f},"args":{{"batch":{}}}}})",
                    e.name, e.section + 1, e.thread, static_cast<double>(e.begin_ns) / 1e3,
                    static_cast<double>(e.end_ns - e.begin_ns) / 1e3, e.batch));
  }
  out += "\n]}\n";
  write_file_atomic(path, out);
}

} // namespace kdflow::trace
