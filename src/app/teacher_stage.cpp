// One teacher's replicas and their stage graphs (teacher_stage.hpp).
#include "teacher_stage.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::app {

void TeacherStage::add(const affinity::CpuList& cpus, int first_index) {
  units_.push_back(std::make_unique<TeacherUnit>(run_, teacher_, cpus, first_index));
}

void TeacherStage::start(Launch launch) {
  launch_ = std::move(launch);
  for (auto& unit : units_) start(*unit);
}

void TeacherStage::start(TeacherUnit& unit) {
  const auto lane = static_cast<std::uint32_t>(teacher_);
  unit.graph = std::make_unique<StageGraph>(
      run_.teachers.size() > 1 ? fmt::format("teacher {}", teacher_) : std::string("teacher"),
      unit.arena(), 1, *launch_.ring, RingStage::teacher, launch_.end,
      [body = &launch_.body, u = &unit](std::uint64_t b, int) { return (*body)(*u, b); },
      launch_.totals, launch_.first_batch, lane);
  unit.graph->start();
}

void TeacherStage::wait() {
  for (auto& unit : units_)
    if (unit->graph) unit->graph->wait();
}

bool TeacherStage::rebuild(const std::vector<affinity::CpuList>& replicas, int first_index) {
  if (launch_.ring == nullptr) throw std::logic_error("TeacherStage::rebuild: not started");
  for (std::size_t k = 0; k < std::max(replicas.size(), units_.size()); ++k) {
    const bool keep = k < replicas.size() && k < units_.size() && units_[k]->cpus() == replicas[k];
    if (!keep && k < units_.size()) {
      units_[k]->graph->request_stop();
      units_[k]->graph->wait();
      if (launch_.ring->closed()) return false;
    }
    if (k < replicas.size()) {
      if (!keep) {
        auto unit = std::make_unique<TeacherUnit>(run_, teacher_, replicas[k], first_index);
        start(*unit);
        if (k < units_.size())
          units_[k] = std::move(unit);
        else
          units_.push_back(std::move(unit));
      }
      first_index += static_cast<int>(replicas[k].size());
    }
  }
  units_.resize(replicas.size());
  return true;
}

} // namespace kdflow::app
