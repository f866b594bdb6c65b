// kdflow data sample (data_command.hpp): the run's datasets and augmentation as prepare_run builds
// them (no teacher, no plan), each asked-for sample drawn as the loader draws it for the epoch.
#include "data_command.hpp"

#include "run.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/cpu_teacher/npy.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {

int data_sample_command(const DataSampleArgs& args) {
  const Config config = resolve_config(args.config, args.sets);
  const Split split = args.split == "test" ? Split::test : Split::train;
  const ImageGeometry geometry = image_geometry(config);
  const Dataset data = Dataset::load(config.get_string("data.dataset"),
                                     config.get_string("data.path"), split, geometry);
  check_geometry(geometry, data);
  AugmentConfig augment;
  augment.augment = split == Split::train;
  augment.pad_crop = static_cast<int>(config.get_int("data.pad_crop"));
  augment.hflip = config.get_bool("data.hflip");
  const auto seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  SampleScratch scratch;
  std::vector<std::uint8_t> pixels(data.sample_bytes());
  std::vector<float> all;
  nlohmann::json samples = nlohmann::json::array();
  for (const std::int64_t index : args.indices) {
    if (index < 0 || static_cast<std::uint64_t>(index) >= data.size())
      throw InputError(
          fmt::format("--index {}: {} has samples 0 to {}", index, data.source(), data.size() - 1));
    const auto i = static_cast<std::uint32_t>(index);
    const SampleDraw draw = draw_sample(augment, seed, static_cast<std::uint64_t>(args.epoch), i);
    const auto decoded = augmented_sample(data, i, draw, scratch, pixels.data());
    all.insert(all.end(), pixels.begin(), pixels.end());
    nlohmann::json s = {{"index", index},
                        {"label", data.label(i)},
                        {"flip", draw.flip},
                        {"shift", {draw.dy, draw.dx}}};
    if (data.decodes()) {
      s["file"] = data.file(i);
      s["image"] = {decoded.height, decoded.width};
      const CropBox& b = decoded.box;
      s["box"] = {b.top, b.left, b.height, b.width};
      if (augment.augment && geometry.random_resized) {
        std::vector<double> draws;
        (void)random_resized_crop_box(decoded.height, decoded.width, geometry.range, draw.crop.key,
                                      &draws);
        s["draws"] = draws;
      } else {
        s["crop_at"] = {draw.crop.y, draw.crop.x};
      }
    }
    samples.push_back(std::move(s));
  }
  teacher::write_npy(args.out,
                     {static_cast<std::int64_t>(args.indices.size()), data.channels(),
                      data.height(), data.width()},
                     all.data());
  const nlohmann::json result = {{"data", data.source()},
                                 {"split", args.split},
                                 {"epoch", args.epoch},
                                 {"seed", seed},
                                 {"random_resized_crop", geometry.random_resized},
                                 {"size", geometry.size},
                                 {"resize", geometry.resize},
                                 {"pixels", args.out},
                                 {"samples", samples}};
  fmt::print("{}\n", result.dump());
  return kExitOk;
}

} // namespace kdflow::app
