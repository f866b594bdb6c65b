// Datasets as uint8 images (N x C x H x W) with labels: IDX (MNIST, Fashion-MNIST; raw or .gz) and
// CIFAR-10/100 binary batches held in memory, and image folders, whose training split stays on disk
// and is decoded by the loader cores batch by batch. Every header, count and label is validated; a
// bad file is an InputError naming it (and the record or offset).
#pragma once

#include "kdflow/core/image_folder.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kdflow {

enum class Split { train, test };

// One thread's means of reading samples that are decoded on demand (an image folder's).
struct SampleScratch {
  ImageDecoder decoder;
  std::vector<std::uint8_t> pixels;
};

class Dataset {
public:
  // format: a name of the registry (dataset_names(): fashion-mnist, mnist, cifar10, cifar100,
  // folder); `path` is the folder holding the files under their usual names.
  static Dataset load(const std::string& format, const std::string& path, Split split,
                      const ImageGeometry& geometry = {});
  // An image folder: `path/train/<class>/*` and `path/val/<class>/*` or `path/test/<class>/*`, 3
  // channels, `geometry.size` square. Both splits are decoded on demand by sample() (the test
  // split at its centre crop): an evaluation holds the images it is at, not the split.
  static Dataset from_folder(const std::string& path, Split split, const ImageGeometry& geometry);

  [[nodiscard]] std::size_t size() const { return labels_.size(); }
  [[nodiscard]] int channels() const { return channels_; }
  [[nodiscard]] int height() const { return height_; }
  [[nodiscard]] int width() const { return width_; }
  [[nodiscard]] int classes() const { return classes_; }
  [[nodiscard]] std::size_t sample_bytes() const {
    return static_cast<std::size_t>(channels_) * height_ * width_;
  }
  // Whether samples are decoded on demand (an image folder's training split): image() is then
  // unavailable and sample() decodes.
  [[nodiscard]] bool decodes() const { return folder_ != nullptr; }
  // Sample i of a dataset held in memory.
  [[nodiscard]] std::span<const std::uint8_t> image(std::size_t i) const;
  // A digest of the images of a dataset held in memory and their shape (fnv1a_wide): the same
  // pixels give the same value wherever they were read from. std::logic_error when it decodes.
  [[nodiscard]] std::uint64_t pixel_digest() const;
  // Sample i, C x H x W: in memory, a view; decoded, read, resized and cropped at `crop` into
  // `scratch` (an InputError naming the file if it does not decode).
  // `decoded`, when given, receives what the decoder reports (a decoded image's).
  [[nodiscard]] std::span<const std::uint8_t>
  sample(std::size_t i, SampleScratch& scratch, CropPosition crop = {},
         ImageDecoder::Decoded* decoded = nullptr) const;
  // The file sample i is decoded from (an image folder's), else empty.
  [[nodiscard]] std::string file(std::size_t i) const;
  [[nodiscard]] int label(std::size_t i) const { return labels_[i]; }
  [[nodiscard]] const std::string& source() const { return source_; }
  // Class names where the format has them (an image folder's sorted folder names), else empty.
  [[nodiscard]] const std::vector<std::string>& class_names() const { return class_names_; }

  // For tests and synthetic data: takes the arrays as they are (validated).
  Dataset(std::vector<std::uint8_t> pixels, std::vector<std::uint16_t> labels, int channels,
          int height, int width, int classes, std::string source);

private:
  Dataset(std::shared_ptr<const ImageFolder> folder, const ImageGeometry& geometry,
          std::string source);

  std::vector<std::uint8_t> pixels_;
  std::vector<std::uint16_t> labels_;
  int channels_ = 0, height_ = 0, width_ = 0, classes_ = 0;
  std::string source_;
  std::vector<std::string> class_names_;
  std::shared_ptr<const ImageFolder> folder_; // set: decoded on demand
  ImageGeometry geometry_;
};

// One entry of the dataset registry: a format's name, its reader, and its default normalization
// (data.mean/data.std = auto).
struct DatasetFormat {
  const char* name;
  Dataset (*load)(const std::string& path, Split split, const ImageGeometry& geometry);
  struct {
    std::vector<float> mean, std;
  } normalization;
};

// The registry's names, in its order (data.dataset's choices).
std::vector<std::string> dataset_names();
// The format called `name`; InputError naming data.dataset and the choices otherwise.
const DatasetFormat& dataset_format(const std::string& name);

// The most a dataset file may hold (inflated): CIFAR-100's training file is 150 MB and
// Fashion-MNIST's 47 MB; a larger IDX or CIFAR file is plausible, one that fills the memory is not.
inline constexpr std::uint64_t kMaxDatasetFileBytes = std::uint64_t{4} << 30;

// Whole-file read, gunzipped when the name ends in .gz; InputError naming the file otherwise, or
// when it holds (or inflates to) more than `max_bytes`.
std::vector<std::uint8_t> read_file_maybe_gz(const std::string& path,
                                             std::uint64_t max_bytes = kMaxDatasetFileBytes);

} // namespace kdflow
