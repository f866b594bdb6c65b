// One rank of a torchrun job: c10d's TCPStore for the rendezvous and a c10d process group (NCCL for
// a CUDA student, Gloo on the CPU) for the collectives, from PyTorch itself. A heartbeat in the
// store lets a rank whose collective failed or timed out name the rank that was lost. Torch-free.
#pragma once

#include "kdflow/core/dist_env.hpp"
#include "kdflow/gpu_student/device.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace kdflow::student {

struct DistOptions {
  std::string backend = "auto"; // auto (nccl for a CUDA student, else gloo) | nccl | gloo
  double timeout_s = 300;       // a collective (or the rendezvous) that takes longer fails
  double bucket_mb = 25;        // gradient buckets: each all-reduced as soon as it is full
};

// Another rank was lost (exited, killed, or stopped answering within dist.timeout_s): the message
// names it when the heartbeats tell which.
class RankLost : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class ProcessGroup {
public:
  // Joins the job (every rank must): InputError for a backend this build or device cannot use;
  // RankLost when the others do not come within the timeout.
  ProcessGroup(const DistEnv& env, const DistOptions& options, const Device& device);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  [[nodiscard]] int rank() const;
  [[nodiscard]] int world() const;
  [[nodiscard]] const std::string& backend() const; // "gloo" or "nccl"
  [[nodiscard]] const DistOptions& options() const;

  // Collectives every rank calls in the same order; `what` names the step for a RankLost.
  // Element-wise sums over the ranks, in place.
  void sum(std::span<double> values, const std::string& what);
  // Rank 0's bytes, on every rank.
  [[nodiscard]] std::vector<std::byte> broadcast(std::vector<std::byte> bytes,
                                                 const std::string& what);
  // Every rank's text, by rank.
  [[nodiscard]] std::vector<std::string> all_gather(const std::string& text,
                                                    const std::string& what);
  // Start-up failures agreed: when any rank has one, every rank throws. A rank rethrows its own
  // (`error`, or nothing); the others throw the same kind (Interrupted, InputError, else
  // runtime_error) saying which rank failed and why, so that every rank exits with the same code.
  void agree(const std::exception_ptr& error);

  // The torch side (process_group_impl.hpp), for the student's gradient buckets.
  struct Impl;
  [[nodiscard]] Impl& impl() const { return *impl_; }

private:
  std::unique_ptr<Impl> impl_;
};

} // namespace kdflow::student
