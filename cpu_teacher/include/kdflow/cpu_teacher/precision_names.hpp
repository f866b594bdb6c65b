// The names of the teacher's precisions, in one place: what parse_precision (engine.hpp) reads and
// what the configuration offers (teacher.precision, a teacher row's precision).
#pragma once

#include <string>
#include <vector>

namespace kdflow::teacher {

const std::vector<std::string>& precision_names(); // fp32, bf16

} // namespace kdflow::teacher
