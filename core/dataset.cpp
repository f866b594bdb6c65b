// IDX and CIFAR readers with validation of magic numbers, counts, sizes and labels; image folders.
#include "kdflow/core/dataset.hpp"

#include "kdflow/core/digest.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow {
namespace {

namespace fs = std::filesystem;

std::uint32_t big_endian(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// The first of `names` that exists in `dir`, or an InputError listing where kdflow looked.
std::string find_file(const std::string& dir, const std::vector<std::string>& names) {
  // A link counts as there (a loop or a dangling one is refused by name when it is read).
  std::error_code ec;
  for (const auto& n : names)
    if (fs::exists(fs::symlink_status(fs::path(dir) / n, ec))) return (fs::path(dir) / n).string();
  std::string looked;
  for (const auto& n : names) looked += (looked.empty() ? "" : ", ") + (fs::path(dir) / n).string();
  throw InputError(fmt::format("dataset not found: looked for {}", looked));
}

Dataset load_idx(const std::string& dir, Split split, const std::string& name) {
  const std::string stem = split == Split::train ? "train" : "t10k";
  const std::string images_path =
      find_file(dir, {stem + "-images-idx3-ubyte.gz", stem + "-images-idx3-ubyte",
                      stem + "-images.idx3-ubyte"});
  const std::string labels_path =
      find_file(dir, {stem + "-labels-idx1-ubyte.gz", stem + "-labels-idx1-ubyte",
                      stem + "-labels.idx1-ubyte"});
  const auto images = read_file_maybe_gz(images_path);
  const auto labels = read_file_maybe_gz(labels_path);
  if (images.size() < 16 || big_endian(images, 0) != 0x00000803)
    throw InputError(fmt::format("{}: not an IDX image file (magic {:#010x}, want 0x00000803)",
                                 images_path, images.size() >= 4 ? big_endian(images, 0) : 0));
  if (labels.size() < 8 || big_endian(labels, 0) != 0x00000801)
    throw InputError(fmt::format("{}: not an IDX label file (magic {:#010x}, want 0x00000801)",
                                 labels_path, labels.size() >= 4 ? big_endian(labels, 0) : 0));
  const std::size_t n = big_endian(images, 4), h = big_endian(images, 8),
                    w = big_endian(images, 12);
  if (big_endian(labels, 4) != n)
    throw InputError(fmt::format("{}: {} labels for {} images in {}", labels_path,
                                 big_endian(labels, 4), n, images_path));
  // Sizes checked by division: n * h * w of a lying header may not fit in 64 bits.
  constexpr std::size_t kMaxSide = 1 << 16;
  if (h == 0 || w == 0 || h > kMaxSide || w > kMaxSide)
    throw InputError(fmt::format("{}: images of {}x{} pixels (each side from 1 to {})", images_path,
                                 h, w, kMaxSide));
  const std::size_t body = images.size() - 16;
  if (body % (h * w) != 0 || body / (h * w) != n)
    throw InputError(fmt::format("{}: truncated or too long: {} bytes of pixels, the header "
                                 "promises {} images of {}x{}",
                                 images_path, body, n, h, w));
  if (labels.size() != 8 + n)
    throw InputError(fmt::format("{}: truncated: {} bytes, the header promises {}", labels_path,
                                 labels.size(), 8 + n));
  std::vector<std::uint8_t> pixels(images.begin() + 16, images.end());
  std::vector<std::uint16_t> lab(labels.begin() + 8, labels.end());
  for (std::size_t i = 0; i < n; ++i)
    if (lab[i] >= 10)
      throw InputError(
          fmt::format("{}: record {} has label {}, outside 0..9", labels_path, i, lab[i]));
  return Dataset(std::move(pixels), std::move(lab), 1, static_cast<int>(h), static_cast<int>(w), 10,
                 fmt::format("{} {} ({})", name, split == Split::train ? "train" : "test", dir));
}

// CIFAR binary batches: records of <label byte(s)><3072 pixel bytes, CHW>.
Dataset load_cifar(const std::string& dir, Split split, bool hundred) {
  std::vector<std::string> files;
  if (hundred)
    files = {find_file(dir, {split == Split::train ? "train.bin" : "test.bin"})};
  else if (split == Split::test)
    files = {find_file(dir, {"test_batch.bin"})};
  else
    for (int k = 1; k <= 5; ++k)
      files.push_back(find_file(dir, {fmt::format("data_batch_{}.bin", k)}));
  const std::size_t label_bytes = hundred ? 2 : 1, record = label_bytes + 3072;
  const int classes = hundred ? 100 : 10;
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint16_t> labels;
  for (const auto& f : files) {
    const auto bytes = read_file_maybe_gz(f);
    if (bytes.empty() || bytes.size() % record != 0)
      throw InputError(fmt::format(
          "{}: {} bytes is not a whole number of {}-byte CIFAR records (truncated at record {})", f,
          bytes.size(), record, bytes.size() / record));
    for (std::size_t r = 0; r < bytes.size() / record; ++r) {
      const std::uint8_t label = bytes[r * record + label_bytes - 1]; // CIFAR-100: fine label
      if (label >= classes)
        throw InputError(
            fmt::format("{}: record {} has label {}, outside 0..{}", f, r, label, classes - 1));
      labels.push_back(label);
      pixels.insert(pixels.end(),
                    bytes.begin() + static_cast<std::ptrdiff_t>(r * record + label_bytes),
                    bytes.begin() + static_cast<std::ptrdiff_t>((r + 1) * record));
    }
  }
  return Dataset(std::move(pixels), std::move(labels), 3, 32, 32, classes,
                 fmt::format("{} {} ({})", hundred ? "cifar100" : "cifar10",
                             split == Split::train ? "train" : "test", dir));
}

std::string folder_split(const std::string& dir, Split split) {
  if (split == Split::train) return find_file(dir, {"train"});
  return find_file(dir, {"val", "test"});
}

} // namespace

std::vector<std::uint8_t> read_file_maybe_gz(const std::string& path, std::uint64_t max_bytes) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  // A plain file's size is its content's; a gzipped one's is counted as it inflates.
  check_input_file(path, "dataset file",
                   gz ? std::numeric_limits<std::uint64_t>::max() : max_bytes);
  std::vector<std::uint8_t> out;
  const auto too_big = [&] {
    return InputError(
        fmt::format("{}: more than {} bytes (a dataset file kdflow reads whole)", path, max_bytes));
  };
  if (gz) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) throw InputError(fmt::format("{}: cannot open", path));
    std::uint8_t buf[1 << 16];
    int got = 0;
    // A small file may inflate a thousandfold (a gzip bomb): counted as it inflates.
    while ((got = gzread(f, buf, sizeof(buf))) > 0) {
      if (out.size() + static_cast<std::size_t>(got) > max_bytes) {
        gzclose(f);
        throw too_big();
      }
      out.insert(out.end(), buf, buf + got);
    }
    int err = 0;
    const char* msg = gzerror(f, &err);
    const bool bad = got < 0 || (err != Z_OK && err != Z_STREAM_END);
    const std::string what = msg ? msg : "";
    gzclose(f);
    if (bad)
      throw InputError(
          fmt::format("{}: corrupt gzip data after {} bytes ({})", path, out.size(), what));
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open", path));
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (out.size() > max_bytes) throw too_big(); // grew while being read
  return out;
}

Dataset::Dataset(std::vector<std::uint8_t> pixels, std::vector<std::uint16_t> labels, int channels,
                 int height, int width, int classes, std::string source)
    : pixels_(std::move(pixels)), labels_(std::move(labels)), channels_(channels), height_(height),
      width_(width), classes_(classes), source_(std::move(source)) {
  if (labels_.empty()) throw InputError(fmt::format("{}: the dataset is empty", source_));
  if (pixels_.size() != labels_.size() * sample_bytes())
    throw InputError(fmt::format("{}: {} pixel bytes for {} samples of {} bytes", source_,
                                 pixels_.size(), labels_.size(), sample_bytes()));
}

Dataset::Dataset(std::shared_ptr<const ImageFolder> folder, const ImageGeometry& geometry,
                 std::string source)
    : labels_(folder->labels), channels_(3), height_(geometry.size), width_(geometry.size),
      classes_(static_cast<int>(folder->classes.size())), source_(std::move(source)),
      class_names_(folder->classes), folder_(std::move(folder)), geometry_(geometry) {}

std::span<const std::uint8_t> Dataset::image(std::size_t i) const {
  if (folder_) throw std::logic_error(source_ + ": decoded on demand; use sample()");
  return {pixels_.data() + i * sample_bytes(), sample_bytes()};
}

std::uint64_t Dataset::pixel_digest() const {
  if (folder_) throw std::logic_error(source_ + ": decoded on demand: no pixels held to digest");
  const std::uint64_t shape[] = {size(), static_cast<std::uint64_t>(channels_),
                                 static_cast<std::uint64_t>(height_),
                                 static_cast<std::uint64_t>(width_)};
  return fnv1a_wide(std::as_bytes(std::span(pixels_)), fnv1a(std::as_bytes(std::span(shape))));
}

std::span<const std::uint8_t> Dataset::sample(std::size_t i, SampleScratch& scratch,
                                              CropPosition crop,
                                              ImageDecoder::Decoded* decoded) const {
  if (!folder_) return {pixels_.data() + i * sample_bytes(), sample_bytes()};
  scratch.pixels.resize(sample_bytes());
  const auto got =
      scratch.decoder.decode(folder_->files[i], geometry_, crop, scratch.pixels.data());
  if (decoded != nullptr) *decoded = got;
  return scratch.pixels;
}

std::string Dataset::file(std::size_t i) const {
  return folder_ ? folder_->files[i] : std::string();
}

Dataset Dataset::from_folder(const std::string& path, Split split, const ImageGeometry& geometry) {
  if (geometry.size < 1 || geometry.resize < geometry.size)
    throw InputError(fmt::format("data.resize = {}: smaller than data.image_size = {}",
                                 geometry.resize, geometry.size));
  const std::string root = folder_split(path, split);
  auto folder = std::make_shared<const ImageFolder>(list_image_folder(root));
  const std::string source = fmt::format(
      "folder {} ({}: {} images, {} classes{})", split == Split::train ? "train" : "test", root,
      folder->files.size(), folder->classes.size(),
      folder->ignored > 0 ? fmt::format(", {} other files ignored", folder->ignored) : "");
  return Dataset(std::move(folder), geometry, source);
}

namespace {

// The dataset registry: each format once, with its reader and its default normalization (the
// training split's per-channel statistics, pixels scaled to [0, 1]). A new format is an entry here.
const DatasetFormat kFormats[] = {
    {"fashion-mnist",
     [](const std::string& path, Split split, const ImageGeometry&) {
       return load_idx(path, split, "fashion-mnist");
     },
     {{0.2860f}, {0.3530f}}},
    {"mnist",
     [](const std::string& path, Split split, const ImageGeometry&) {
       return load_idx(path, split, "mnist");
     },
     {{0.1307f}, {0.3081f}}},
    {"cifar10",
     [](const std::string& path, Split split, const ImageGeometry&) {
       return load_cifar(path, split, false);
     },
     {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}}},
    {"cifar100",
     [](const std::string& path, Split split, const ImageGeometry&) {
       return load_cifar(path, split, true);
     },
     {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}}},
    // ImageNet's statistics, what torchvision's pretrained pipelines use (computing a folder's own
    // would mean decoding all of it before the first step).
    {"folder", &Dataset::from_folder, {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}},
};

} // namespace

std::vector<std::string> dataset_names() {
  std::vector<std::string> names;
  for (const auto& f : kFormats) names.emplace_back(f.name);
  return names;
}

const DatasetFormat& dataset_format(const std::string& name) {
  for (const auto& f : kFormats)
    if (name == f.name) return f;
  throw InputError(fmt::format("data.dataset = '{}': not supported ({})", name,
                               fmt::join(dataset_names(), ", ")));
}

Dataset Dataset::load(const std::string& format, const std::string& path, Split split,
                      const ImageGeometry& geometry) {
  const DatasetFormat& reader = dataset_format(format);
  check_input_folder(path, "data.path");
  return reader.load(path, split, geometry);
}

} // namespace kdflow
