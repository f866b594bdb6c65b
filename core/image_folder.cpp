// Image folder listing and the per-thread decoder: file read, libjpeg-turbo or libpng decode to
// RGB, box reduction for large downscales, then bilinear resize of only the cropped window.
#include "kdflow/core/image_folder.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/image_adapter.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace kdflow {
namespace {

enum class ImageKind { jpeg, png, other };

ImageKind kind_of(const std::uint8_t* bytes, std::size_t size) {
  static constexpr std::array<std::uint8_t, 8> kPng = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return ImageKind::jpeg;
  if (size >= kPng.size() && std::equal(kPng.begin(), kPng.end(), bytes)) return ImageKind::png;
  return ImageKind::other;
}

bool is_image_name(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// POSIX rather than std::filesystem: the LibTorch in the same process exports an older
// std::filesystem that the dynamic linker may bind our calls to.
struct Entry {
  std::string name;
  bool directory;
  bool regular; // a plain file (not a FIFO, socket or device, which a read could block on)
};

std::vector<Entry> sorted_entries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    throw InputError(fmt::format("{}: cannot open folder ({})", dir, std::strerror(errno)));
  std::vector<Entry> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name.starts_with('.')) continue; // hidden files too
    struct stat st {};
    if (::stat((dir + "/" + name).c_str(), &st) != 0) continue; // a dangling link
    out.push_back({name, S_ISDIR(st.st_mode), S_ISREG(st.st_mode)});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return out;
}

// Reads `path` whole into `buffer` (resized within its capacity once it has grown).
void read_whole(const std::string& path, std::vector<std::uint8_t>& buffer, std::size_t limit) {
  // Non-blocking: a FIFO put in a listed file's place must not hang the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw InputError(fmt::format("{}: cannot stat ({})", path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("{}: not a regular file (a FIFO, socket or device)", path));
  }
  const auto size = std::min<std::size_t>(static_cast<std::size_t>(st.st_size), limit);
  buffer.resize(size);
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, buffer.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(fmt::format("{}: read failed after {} of {} bytes ({})", path, got, size,
                                   n == 0 ? "end of file" : std::strerror(err)));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

struct TjDeleter {
  void operator()(void* h) const {
    if (h != nullptr) tjDestroy(h);
  }
};

} // namespace

ImageFolder list_image_folder(const std::string& root) {
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InputError(fmt::format("{}: no such folder", root));
  ImageFolder folder;
  folder.root = root;
  std::vector<std::uint8_t> head;
  for (const auto& entry : sorted_entries(root)) {
    if (!entry.directory) {
      ++folder.ignored;
      continue;
    }
    if (folder.classes.size() > std::numeric_limits<std::uint16_t>::max())
      throw InputError(fmt::format("{}: more than {} class folders", root,
                                   std::numeric_limits<std::uint16_t>::max() + 1));
    const auto label = static_cast<std::uint16_t>(folder.classes.size());
    const std::string class_dir = root + "/" + entry.name;
    std::size_t images = 0;
    for (const auto& file : sorted_entries(class_dir)) {
      if (file.directory || !is_image_name(file.name)) {
        ++folder.ignored;
        continue;
      }
      const std::string path = class_dir + "/" + file.name;
      if (!file.regular)
        throw InputError(fmt::format("{}: not a regular file (a FIFO, socket or device)", path));
      read_whole(path, head, 8); // the signature only: decoding every file would cost an epoch
      if (kind_of(head.data(), head.size()) == ImageKind::other)
        throw InputError(fmt::format("{}: not a JPEG or PNG file (its first bytes)", path));
      folder.files.push_back(path);
      folder.labels.push_back(label);
      ++images;
    }
    if (images == 0)
      throw InputError(
          fmt::format("{}: empty class folder (no .jpg, .jpeg or .png files)", class_dir));
    folder.classes.push_back(entry.name);
  }
  if (folder.classes.empty())
    throw InputError(fmt::format("{}: no class folders (want {}/<class>/*.jpg|*.png)", root, root));
  return folder;
}

namespace {

// The most pixels an image may declare: above any camera's photo (a 100-megapixel medium-format
// one), and its RGB buffer (400 MB) still fits a loader thread's share of memory. A header that
// claims more is refused before anything is allocated for it.
constexpr std::int64_t kMaxImagePixels = std::int64_t{1} << 27;

void check_pixels(const std::string& path, std::int64_t w, std::int64_t h) {
  if (w > 0 && h > 0 && w <= kMaxImagePixels / h) return;
  throw InputError(fmt::format("{}: its header claims {}x{} pixels (at most {} in all)", path, w, h,
                               kMaxImagePixels));
}

} // namespace

struct ImageDecoder::Impl {
  std::unique_ptr<void, TjDeleter> jpeg{tjInitDecompress()};
  std::vector<std::uint8_t> file, rgb, reduced;
  LinearTaps rows, cols; // the crop's bilinear taps

  // Decodes `path` (already in `file`) to interleaved RGB in `rgb`; returns its height and width.
  // A JPEG is decoded with the smallest DCT scaling whose shorter side still reaches `at_least`.
  std::pair<int, int> decode_rgb(const std::string& path, int at_least) {
    switch (kind_of(file.data(), file.size())) {
    case ImageKind::jpeg: return decode_jpeg(path, at_least);
    case ImageKind::png: return decode_png(path);
    case ImageKind::other: break;
    }
    throw InputError(fmt::format("{}: not a JPEG or PNG file (its first bytes)", path));
  }

  std::pair<int, int> decode_jpeg(const std::string& path, int at_least) {
    if (!jpeg) throw std::runtime_error("libjpeg-turbo: tjInitDecompress failed");
    int w = 0, h = 0, subsampling = 0, colorspace = 0;
    if (tjDecompressHeader3(jpeg.get(), file.data(), file.size(), &w, &h, &subsampling,
                            &colorspace) != 0)
      throw InputError(fmt::format("{}: undecodable JPEG ({})", path, tjGetErrorStr2(jpeg.get())));
    check_pixels(path, w, h);
    int factors = 0;
    const tjscalingfactor* scaling = tjGetScalingFactors(&factors);
    int sw = w, sh = h;
    for (int k = 0; k < factors; ++k) { // the smallest scaled size that is still large enough
      const int kw = TJSCALED(w, scaling[k]), kh = TJSCALED(h, scaling[k]);
      if (std::min(kw, kh) >= at_least && std::int64_t{kw} * kh < std::int64_t{sw} * sh) {
        sw = kw;
        sh = kh;
      }
    }
    rgb.resize(static_cast<std::size_t>(sw) * sh * 3);
    // Warnings (a truncated scan, for one) count as failures: the image would be part grey.
    if (tjDecompress2(jpeg.get(), file.data(), file.size(), rgb.data(), sw, 0, sh, TJPF_RGB,
                      TJFLAG_STOPONWARNING) != 0)
      throw InputError(fmt::format("{}: undecodable JPEG ({})", path, tjGetErrorStr2(jpeg.get())));
    return {sh, sw};
  }

  std::pair<int, int> decode_png(const std::string& path) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    const auto fail = [&](const char* what) {
      const std::string message = image.message[0] != '\0' ? image.message : what;
      png_image_free(&image);
      return InputError(fmt::format("{}: undecodable PNG ({})", path, message));
    };
    if (png_image_begin_read_from_memory(&image, file.data(), file.size()) == 0)
      throw fail("bad header");
    if (std::int64_t{image.width} * std::int64_t{image.height} > kMaxImagePixels ||
        image.width == 0 || image.height == 0) {
      png_image_free(&image);
      check_pixels(path, image.width, image.height);
    }
    image.format = PNG_FORMAT_RGB; // grey, palette, 16-bit and alpha all come out as 8-bit RGB
    rgb.resize(PNG_IMAGE_SIZE(image));
    const png_color black{0, 0, 0};
    if (png_image_finish_read(&image, &black, rgb.data(), 0, nullptr) == 0) throw fail("bad data");
    if ((image.warning_or_error & PNG_IMAGE_ERROR) != 0) throw fail("bad data");
    const auto h = static_cast<int>(image.height), w = static_cast<int>(image.width);
    png_image_free(&image);
    return {h, w};
  }

  // Averages k x k blocks of the h x w RGB image in `rgb` into `reduced`: resizing by more than two
  // with bilinear sampling alone would alias.
  std::pair<int, int> box_reduce(int h, int w, int k) {
    const int rh = h / k, rw = w / k;
    reduced.resize(static_cast<std::size_t>(rh) * rw * 3);
    const int area = k * k;
    for (int y = 0; y < rh; ++y)
      for (int x = 0; x < rw; ++x)
        for (int c = 0; c < 3; ++c) {
          int sum = 0;
          for (int dy = 0; dy < k; ++dy) {
            const std::uint8_t* row =
                rgb.data() + (static_cast<std::size_t>(y * k + dy) * w + x * k) * 3 + c;
            for (int dx = 0; dx < k; ++dx) sum += row[dx * 3];
          }
          reduced[(static_cast<std::size_t>(y) * rw + x) * 3 + c] =
              static_cast<std::uint8_t>((sum + area / 2) / area);
        }
    rgb.swap(reduced);
    return {rh, rw};
  }
};

ImageDecoder::ImageDecoder() : impl_(std::make_unique<Impl>()) {}
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

void ImageDecoder::decode(const std::string& path, const ImageGeometry& g, CropPosition crop,
                          std::uint8_t* out) {
  if (g.size < 1 || g.resize < g.size)
    throw std::invalid_argument(
        fmt::format("image geometry: resize {} < size {}", g.resize, g.size));
  Impl& m = *impl_;
  read_whole(path, m.file, std::numeric_limits<std::size_t>::max());
  auto [h, w] = m.decode_rgb(path, g.resize);
  // The resized image: shorter side `resize`, the other in proportion.
  const bool tall = h > w;
  const int short_side = tall ? w : h;
  const int rh =
      tall ? static_cast<int>(std::lround(static_cast<double>(h) * g.resize / w)) : g.resize;
  const int rw =
      tall ? g.resize : static_cast<int>(std::lround(static_cast<double>(w) * g.resize / h));
  if (const int k = box_factor(short_side, g.resize); k >= 2)
    std::tie(h, w) = m.box_reduce(h, w, k);
  const int oy = static_cast<int>(std::lround(std::clamp(crop.y, 0.f, 1.f) * (rh - g.size)));
  const int ox = static_cast<int>(std::lround(std::clamp(crop.x, 0.f, 1.f) * (rw - g.size)));
  const std::size_t plane = static_cast<std::size_t>(g.size) * g.size;
  const std::uint8_t* src = m.rgb.data();
  if (h == rh && w == rw) { // no resize: the crop is a copy (and de-interleave)
    for (int y = 0; y < g.size; ++y) {
      const std::uint8_t* row = src + (static_cast<std::size_t>(oy + y) * w + ox) * 3;
      for (int x = 0; x < g.size; ++x)
        for (int c = 0; c < 3; ++c)
          out[c * plane + static_cast<std::size_t>(y) * g.size + x] = row[x * 3 + c];
    }
    return;
  }
  // Bilinear with pixel centres aligned (as PIL and OpenCV), computed for the crop only.
  linear_taps(w, rw, ox, g.size, m.cols);
  linear_taps(h, rh, oy, g.size, m.rows);
  for (int y = 0; y < g.size; ++y) {
    const auto yi = static_cast<std::size_t>(y);
    const float wy = m.rows.frac[yi];
    const std::uint8_t* r0 = src + static_cast<std::size_t>(m.rows.lo[yi]) * w * 3;
    const std::uint8_t* r1 = src + static_cast<std::size_t>(m.rows.hi[yi]) * w * 3;
    for (int x = 0; x < g.size; ++x) {
      const auto xi = static_cast<std::size_t>(x);
      const int a = m.cols.lo[xi] * 3, b = m.cols.hi[xi] * 3;
      const float fx = m.cols.frac[xi];
      for (int c = 0; c < 3; ++c) {
        const float top = r0[a + c] + (r0[b + c] - r0[a + c]) * fx;
        const float bottom = r1[a + c] + (r1[b + c] - r1[a + c]) * fx;
        out[c * plane + static_cast<std::size_t>(y) * g.size + x] =
            static_cast<std::uint8_t>(top + (bottom - top) * wy + 0.5f);
      }
    }
  }
}

} // namespace kdflow
