// The data.* keys (and train.seed) read into what the loader takes: the image folder's geometry,
// the augmentation and normalization, the sampler. Shared by prepare_run and kdflow data sample, so
// that a sample shown is a sample trained on.
#pragma once

#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/image_folder.hpp"
#include "kdflow/core/loader.hpp"

namespace kdflow::app {

// The image folder's geometry from data.image_size, data.resize and the RandomResizedCrop keys
// (each checked: InputError naming the key).
ImageGeometry image_geometry(const Config& config);
// InputError naming data.random_resized_crop where `data` holds its images at their size.
void check_geometry(const ImageGeometry& geometry, const Dataset& data);

// The training augmentation and normalization of `data` from the data.* keys (each checked:
// InputError naming the key); evaluation sets augment = false.
AugmentConfig augment_config(const Config& config, const Dataset& data);

// One process's sampler: data.batch_size, train.seed, data.drop_last, shuffled (the caller sets
// the ranks).
SamplerConfig sampler_config(const Config& config);

} // namespace kdflow::app
