// `kdflow data sample`: one training (or test) sample exactly as the loader makes it for a given
// epoch, written as .npy pixels with its draws as JSON: what the student and teacher see, and the
// check against torchvision's transforms (scripts/check_augment.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kdflow::app {

struct DataSampleArgs {
  std::string config, out, split = "train";
  std::vector<std::string> sets;
  std::vector<std::int64_t> indices;
  std::int64_t epoch = 0;
};

int data_sample_command(const DataSampleArgs& args);

} // namespace kdflow::app
