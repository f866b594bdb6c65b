// The run's teachers from its configuration: the [[teacher]] blocks as specs, the values each
// computes beside its logits, each loaded at the run's batch with every check, how it reads the
// slot's images, and what each costs (by which the teacher cores are shared out).
#pragma once

#include "run_inputs.hpp"

#include "kdflow/core/config.hpp"
#include "kdflow/core/image_adapter.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kdflow::app {

// A comma-separated list of finite numbers, one per channel (one number stands for every
// channel); `positive`: each above zero. InputError naming `key` and the text otherwise.
std::vector<float> parse_floats(const std::string& text, const std::string& key,
                                std::size_t channels, bool positive);

// The values teacher `teacher` computes beside its logits ([teacher]'s: teacher.features, then
// each kd.features pair's value from it not among them; teacher.others[k]'s: its row's features,
// then those of the pairs from k). InputError for a pair without its teacher value or student tap,
// or from a teacher the run lacks.
std::vector<std::string> teacher_feature_names(const Config& config, std::size_t teacher = 0);

// Every teacher a configuration names: [teacher] (with its features), then each teacher.others
// row. InputError for a row without its model.
std::vector<TeacherSpec> teacher_specs(const Config& config);
// [teacher] as the configuration writes it, without the features the run asks of it.
TeacherSpec configured_teacher(const Config& config);

// The teacher `spec` names at the run's batch in `precision`, with every check prepare_run makes:
// its file exists, its input is the model's own (its input_size binds what it leaves open, the
// data's shape the rest), its logits are the dataset's classes (InputError naming the key).
// `threads`: its replicas' (tuning times the plans at it).
std::shared_ptr<const teacher::Teacher> load_run_teacher(const RunInputs& run,
                                                         const TeacherSpec& spec,
                                                         teacher::Precision precision, int threads);
// With several teachers, each one's cost per sample (its FLOPs, `data` being the data's sample
// shape [channels, height, width]), by which the teacher cores are shared out; empty with one.
std::vector<double> teacher_costs(const Config& config, const std::vector<TeacherSpec>& specs,
                                  const teacher::Shape& data);
// How a teacher reads the slot's images (its input_size, mean and std; one line on stderr saying
// what is done to them when anything is). InputError naming the teacher file when its input is
// not an image the data can become.
ImageAdapter teacher_input(const RunInputs& run, const TeacherSpec& spec,
                           const teacher::Teacher& model);
// The same from the teacher's input shape [batch, channels, height, width].
ImageAdapter teacher_input(const RunInputs& run, const TeacherSpec& spec, const teacher::Shape& in);

} // namespace kdflow::app
