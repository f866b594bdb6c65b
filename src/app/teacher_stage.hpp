// One teacher's stage: its replicas (teacher_unit.hpp), each running a stage graph on the
// teacher's lane of the ring. What a replica does with a filled slot (the body) is the pipeline's;
// the stage owns the replicas, starts their graphs, waits for them, and replaces the replicas
// whose CPUs a move changes.
#pragma once

#include "teacher_unit.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace kdflow::app {

class TeacherStage {
public:
  // Ring batch `b` on `unit`'s worker: false when the ring closed.
  using Body = std::function<bool(TeacherUnit& unit, std::uint64_t b)>;
  // How the graphs run: ring batches [0, end) carry the sampler's batches first_batch + b.
  struct Launch {
    SlotRing* ring = nullptr;
    std::uint64_t first_batch = 0, end = 0;
    StageTotals* totals = nullptr;
    Body body;
  };

  TeacherStage(const RunInputs& run, std::size_t teacher) : run_(run), teacher_(teacher) {}

  [[nodiscard]] std::size_t teacher() const { return teacher_; }
  [[nodiscard]] std::size_t replicas() const { return units_.size(); }
  [[nodiscard]] TeacherUnit& unit(std::size_t r) { return *units_.at(r); }
  // A replica on `cpus`, its workers numbered from `first_index` (kd-teacher-N).
  void add(const affinity::CpuList& cpus, int first_index);
  // Starts every replica's graph.
  void start(Launch launch);
  // Waits for every started graph.
  void wait();
  // Replicas on `replicas` (CPU lists, workers numbered from `first_index`): each whose CPUs
  // change is stopped, then made and started anew on its new ones. False when the ring closed
  // meanwhile; std::logic_error before start().
  bool rebuild(const std::vector<affinity::CpuList>& replicas, int first_index);

private:
  void start(TeacherUnit& unit);

  const RunInputs& run_;
  const std::size_t teacher_;
  Launch launch_; // before the units: their graphs' bodies call its body until they are destroyed
  std::vector<std::unique_ptr<TeacherUnit>> units_;
};

} // namespace kdflow::app
