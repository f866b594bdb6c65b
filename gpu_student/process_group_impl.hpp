// The process group's torch side, for the student's modules (the gradient buckets): the c10d
// backend and the device its tensors live on.
#pragma once

#include "kdflow/gpu_student/process_group.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace kdflow::student {

struct ProcessGroup::Impl {
  DistEnv env;
  DistOptions options;
  std::string backend_name;
  torch::Device device{torch::kCPU}; // where the collectives' tensors live (CUDA for NCCL)
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;

  // The heartbeat: "<beat> <step>" under alive/<rank>, once a second, from kd-dist; the step is
  // the trainer's (GradSync sets it), so a lost rank is named with the step it last reached.
  std::atomic<std::int64_t> step{0};
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread heartbeat;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Stops the heartbeat first (also when the group's constructor failed after starting it).
  ~Impl();

  // Waits for `work`; a failure becomes RankLost naming the lost rank.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) const;
  [[noreturn]] void lost(const std::string& what, const std::string& cause) const;
};

} // namespace kdflow::student
