// The data.* keys read into the loader's settings (data_config.hpp).
#include "data_config.hpp"

#include "run_teachers.hpp"

#include "kdflow/core/error.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace kdflow::app {

ImageGeometry image_geometry(const Config& config) {
  ImageGeometry g;
  g.size = static_cast<int>(config.get_int("data.image_size"));
  g.resize = static_cast<int>(config.get_int("data.resize"));
  g.random_resized = config.get_bool("data.random_resized_crop");
  g.dct_scaling = config.get_bool("data.dct_scaling");
  const auto range = [&](const char* key, bool at_most_one) {
    const std::string text = config.get_string(key);
    if (std::count(text.begin(), text.end(), ',') != 1)
      throw InputError(fmt::format("{} = \"{}\": want two numbers, \"lo,hi\"", key, text));
    const auto v = parse_floats(text, key, 2, true);
    if (v[0] > v[1] || (at_most_one && v[1] > 1))
      throw InputError(fmt::format("{} = \"{}\": want \"lo,hi\" with 0 < lo <= hi{}", key, text,
                                   at_most_one ? " <= 1" : ""));
    return std::pair{v[0], v[1]};
  };
  std::tie(g.range.scale_lo, g.range.scale_hi) = range("data.crop_scale", true);
  std::tie(g.range.ratio_lo, g.range.ratio_hi) = range("data.crop_ratio", false);
  return g;
}

void check_geometry(const ImageGeometry& geometry, const Dataset& data) {
  if (geometry.random_resized && !data.decodes())
    throw InputError(fmt::format("data.random_resized_crop = true: image folders only ({} holds "
                                 "its images at their size)",
                                 data.source()));
}

AugmentConfig augment_config(const Config& config, const Dataset& data) {
  AugmentConfig a;
  const auto channels = static_cast<std::size_t>(data.channels());
  const std::string mean = config.get_string("data.mean"), std_dev = config.get_string("data.std");
  const auto& defaults = dataset_format(config.get_string("data.dataset")).normalization;
  a.mean = mean == "auto" ? defaults.mean : parse_floats(mean, "data.mean", channels, false);
  a.std = std_dev == "auto" ? defaults.std : parse_floats(std_dev, "data.std", channels, true);
  a.normalize = config.get_string("data.slot_dtype") == "float32";
  a.pad_crop = static_cast<int>(config.get_int("data.pad_crop"));
  a.hflip = config.get_bool("data.hflip");
  a.mixup_alpha = config.get_double("data.mixup_alpha");
  a.cutmix_alpha = config.get_double("data.cutmix_alpha");
  const std::string jitter = config.get_string("data.color_jitter");
  if (std::count(jitter.begin(), jitter.end(), ',') != 3)
    throw InputError(fmt::format("data.color_jitter = \"{}\": give four values, "
                                 "\"brightness,contrast,saturation,hue\"",
                                 jitter));
  const auto j = parse_floats(jitter, "data.color_jitter", 4, false);
  constexpr const char* kJitterNames[] = {"brightness", "contrast", "saturation", "hue"};
  for (std::size_t k = 0; k < 4; ++k)
    if (j[k] < 0 || (k == 3 && j[k] > 0.5f))
      throw InputError(fmt::format("data.color_jitter = \"{}\": the {} must be {}", jitter,
                                   kJitterNames[k], k == 3 ? "within [0, 0.5]" : "at least 0"));
  a.jitter = JitterRanges{j[0], j[1], j[2], j[3]};
  if (a.mixes() && config.get_string("kd.loss") == "dkd")
    throw InputError("kd.loss = dkd decouples each sample's one target class, which a mixed batch "
                     "(data.mixup_alpha, data.cutmix_alpha) does not have: use kd.loss = kl or "
                     "set both to 0");
  return a;
}

SamplerConfig sampler_config(const Config& config) {
  SamplerConfig s;
  s.batch_size = static_cast<std::size_t>(config.get_int("data.batch_size"));
  s.seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  s.drop_last = config.get_bool("data.drop_last");
  return s;
}

} // namespace kdflow::app
