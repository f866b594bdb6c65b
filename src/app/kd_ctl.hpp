// kd-ctl: a thread (pinned beside the student) that measures the CPU pipeline's stages every
// window and moves one CPU at a time between the loader pool and the teacher replicas, within the
// plan's loader and teacher CPUs. affinity::ElasticPolicy decides; CpuPipeline::reassign moves.
#pragma once

#include "pipeline.hpp"

#include "kdflow/affinity/elastic.hpp"

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kdflow::app {

// kd-ctl's settings (cores.elastic*).
struct ElasticSettings {
  affinity::ElasticOptions policy;
  double window_s = 1.0; // measurement window
  // Called on kd-ctl's thread after each move with its record (a metrics.jsonl line).
  std::function<void(const nlohmann::json&)> on_move;
};

class KdCtl {
public:
  // Why kd-ctl cannot run on `pipeline` (started with its loaders and teacher), or nullopt.
  static std::optional<std::string> why_not(CpuPipeline& pipeline);
  // Starts the thread; `pipeline` must outlive it (and why_not() must have been nullopt).
  KdCtl(CpuPipeline& pipeline, ElasticSettings settings);
  // Stops and joins. A move in progress waits for the stages to drain, which needs the student to
  // go on: stop the pipeline first unless the student is still stepping.
  ~KdCtl();
  KdCtl(const KdCtl&) = delete;
  KdCtl& operator=(const KdCtl&) = delete;

  // kd-ctl's record: windows observed, every move, the assignment now.
  [[nodiscard]] nlohmann::json summary() const;

private:
  void control();

  CpuPipeline& pipeline_;
  ElasticSettings settings_;
  mutable std::mutex record_mutex_; // cold, short
  std::vector<nlohmann::json> moves_;
  std::uint64_t windows_ = 0;
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_; // last: started once everything above exists
};

} // namespace kdflow::app
