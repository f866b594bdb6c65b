// NumPy .npy files of float32 in C order: what `kdflow teacher infer` reads and writes.
#pragma once

#include "kdflow/cpu_teacher/graph.hpp"

#include <string>
#include <vector>

namespace kdflow::teacher {

struct NpyArray {
  Shape shape;
  std::vector<float> data;
};

// InputError naming the file for anything but a float32 (or float64, converted) C-order array.
NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const Shape& shape, const float* data);

} // namespace kdflow::teacher
