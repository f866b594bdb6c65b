// `kdflow data sample`: one training (or test) sample exactly as the loader makes it for a given
// epoch (or one batch, mixed as data.mixup_alpha/cutmix_alpha mix it), written as .npy pixels with
// its draws as JSON: what the student and teacher see, and the
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
  std::int64_t batch = -1; // >= 0: that batch of the epoch, mixed as the loader mixes it
};

int data_sample_command(const DataSampleArgs& args);

} // namespace kdflow::app
