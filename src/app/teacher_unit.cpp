// A teacher replica's unit (teacher_unit.hpp).
#include "teacher_unit.hpp"

namespace kdflow::app {
TeacherUnit::TeacherUnit(const RunInputs& run, std::size_t teacher, const affinity::CpuList& cpus,
                         int first_index)
    : run_(run), teacher_(teacher),
      arena_(std::make_unique<affinity::PinnedArena>(run.topology, cpus, "teacher", first_index,
                                                     producer_priority(run, cpus))) {
  // The replica's buffers are first touched on its own cores (its NUMA node); with uint8 slots,
  // so is its float32 copy of the batch's inputs.
  run_in_arena(arena_->arena(), [&] {
    const auto& model = run_.teachers[teacher_].model;
    replica_ = std::make_unique<teacher::Replica>(model);
    // Buffers for every output but those a slot holds: the logits and the features.
    for (std::size_t k = 1; k < first_feature(*model); ++k)
      other_outputs_.emplace_back(static_cast<std::size_t>(teacher::numel(model->output_shape(k))));
    outputs_.assign(model->output_names().size(), nullptr);
    for (std::size_t k = 0; k < other_outputs_.size(); ++k)
      outputs_[1 + k] = other_outputs_[k].data();
    const ImageAdapter& adapt = run_.teachers[teacher_].input;
    if (!run_.augment.normalize || !adapt.passes_floats())
      inputs_.assign(run_.sampler.batch_size * adapt.to().numel(), 0.f);
  });
}

TeacherUnit::~TeacherUnit() { graph.reset(); }

void TeacherUnit::forward(const Slot& slot, const SlotRegions& regions, std::size_t rows,
                          float* logits) {
  std::span<float*> outputs(outputs_);
  outputs[0] = logits;
  const std::size_t features = first_feature(*run_.teachers[teacher_].model);
  const auto& mine = regions.features[teacher_];
  for (std::size_t k = 0; k < mine.size(); ++k)
    outputs[features + k] = slot.region<float>(mine[k]).data();
  const ImageAdapter& adapt = run_.teachers[teacher_].input;
  if (run_.augment.normalize) {
    const float* images = slot.region<float>(regions.loader.inputs).data();
    if (adapt.passes_floats()) {
      replica_->run(images, outputs);
      return;
    }
    adapt.run(images, rows, inputs_.data(), scratch_);
  } else {
    // uint8 slots: normalized as the loader would have (and resized for the teacher's input).
    adapt.run(slot.region<std::uint8_t>(regions.loader.inputs).data(), rows, inputs_.data(),
              scratch_);
  }
  replica_->run(inputs_.data(), outputs);
}

void TeacherUnit::forward(const float* inputs, std::span<float* const> outputs) {
  replica_->run(inputs, outputs);
}

} // namespace kdflow::app
