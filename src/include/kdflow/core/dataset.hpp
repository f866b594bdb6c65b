// Datasets held in memory as uint8 images (N x C x H x W) with labels: IDX (MNIST, Fashion-MNIST;
// raw or .gz) and CIFAR-10/100 binary batches. Every header, count and label is validated; a bad
// file is an InputError naming it (and the record or offset).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kdflow {

enum class Split { train, test };

class Dataset {
public:
  // format: "fashion-mnist" | "mnist" | "cifar10" | "cifar100"; `path` is the folder holding the
  // files under their usual names.
  static Dataset load(const std::string& format, const std::string& path, Split split);

  [[nodiscard]] std::size_t size() const { return labels_.size(); }
  [[nodiscard]] int channels() const { return channels_; }
  [[nodiscard]] int height() const { return height_; }
  [[nodiscard]] int width() const { return width_; }
  [[nodiscard]] int classes() const { return classes_; }
  [[nodiscard]] std::size_t sample_bytes() const {
    return static_cast<std::size_t>(channels_) * height_ * width_;
  }
  [[nodiscard]] std::span<const std::uint8_t> image(std::size_t i) const {
    return {pixels_.data() + i * sample_bytes(), sample_bytes()};
  }
  [[nodiscard]] int label(std::size_t i) const { return labels_[i]; }
  [[nodiscard]] const std::string& source() const { return source_; }

  // For tests and synthetic data: takes the arrays as they are (validated).
  Dataset(std::vector<std::uint8_t> pixels, std::vector<std::uint8_t> labels, int channels,
          int height, int width, int classes, std::string source);

private:
  std::vector<std::uint8_t> pixels_;
  std::vector<std::uint8_t> labels_;
  int channels_ = 0, height_ = 0, width_ = 0, classes_ = 0;
  std::string source_;
};

// Whole-file read, gunzipped when the name ends in .gz; InputError naming the file otherwise.
std::vector<std::uint8_t> read_file_maybe_gz(const std::string& path);

} // namespace kdflow
