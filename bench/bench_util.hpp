// Small helpers shared by kdflow's benchmark executables: pinning, timing with warm-up and medians,
// and writing the JSON result to stdout and to --json F.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kdflow::bench {

// Pins the calling thread to one CPU of those this process may use (index modulo their count), so
// producer and consumer get different cores when there are at least two.
inline int pin_to_allowed_cpu(int nth) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const int cpu = cpus[static_cast<std::size_t>(nth) % cpus.size()];
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
  return cpu;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `once` (which returns its own elapsed seconds) `warmup` times unrecorded, then `reps` times;
// returns the median.
inline double median_seconds(int warmup, int reps, const std::function<double()>& once) {
  for (int i = 0; i < warmup; ++i) (void)once();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(once());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// `--json F` from argv, or empty.
inline std::string json_path(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") return argv[i + 1];
  return {};
}

inline void emit(const nlohmann::json& result, const std::string& path) {
  std::printf("%s\n", result.dump(2).c_str());
  if (path.empty()) return;
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << result.dump(2) << "\n";
}

} // namespace kdflow::bench
