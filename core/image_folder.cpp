// Image folder listing and the per-thread decoder: file read, libjpeg-turbo or libpng decode to
// RGB, then the crop (torchvision's Resize + CenterCrop/RandomCrop, or RandomResizedCrop) resized
// as PIL resizes, computing only the pixels the crop keeps.
#include "kdflow/core/image_folder.hpp"

#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/image_adapter.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

// jpeglib.h needs size_t and FILE declared first.
#include <cstddef>
#include <cstdio>
#include <jpeglib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <limits>
#include <tuple>

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

// libjpeg's errors, and its warnings (a truncated scan, for one: the image would be part grey),
// end the decode: its error_exit and emit_message jump back to the setjmp of the call in progress.
struct JpegError {
  jpeg_error_mgr mgr{};
  std::jmp_buf jump{};
  std::array<char, JMSG_LENGTH_MAX> message{};
};

extern "C" void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message.data());
  std::longjmp(e->jump, 1);
}

extern "C" void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo); // a warning; trace messages (level >= 0) are ignored
}

// One decompressor, reused image after image (jpeg_abort_decompress between them).
class JpegDecompressor {
public:
  JpegDecompressor() {
    cinfo_.err = jpeg_std_error(&error_.mgr);
    error_.mgr.error_exit = jpeg_fail;
    error_.mgr.emit_message = jpeg_message;
    jpeg_create_decompress(&cinfo_);
  }
  ~JpegDecompressor() { jpeg_destroy_decompress(&cinfo_); }
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;

  // The file's header: false (message()) when libjpeg refuses it.
  bool header(const std::uint8_t* data, std::size_t size, int& width, int& height) {
    jpeg_abort_decompress(&cinfo_);
    if (setjmp(error_.jump) != 0) return fail();
    jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo_, TRUE);
    width = static_cast<int>(cinfo_.image_width);
    height = static_cast<int>(cinfo_.image_height);
    return true;
  }

  // After header(): the image at 1/`denom` scale (DCT domain), as interleaved RGB, of which only
  // rows [top, bottom) and columns [left, right) are wanted. Every row is entropy-decoded (so a
  // damaged file fails whatever the region), but only the region's iMCU rows and columns, with
  // one iMCU of context around them (so its pixels are the full decode's), go through the inverse
  // DCT, upsampling and colour conversion. `rgb` receives rows [*row0, *row0 + rows) and columns
  // [*col0, *col0 + *cols) of the scaled image; false (message()) when libjpeg fails.
  bool region(int denom, int top, int bottom, int left, int right, std::vector<std::uint8_t>& rgb,
              int& row0, int& col0, int& cols) {
    if (setjmp(error_.jump) != 0) return fail();
    cinfo_.scale_num = 1;
    cinfo_.scale_denom = static_cast<unsigned int>(denom);
    cinfo_.out_color_space = JCS_EXT_RGB;
    jpeg_start_decompress(&cinfo_);
    const int width = static_cast<int>(cinfo_.output_width);
    const int height = static_cast<int>(cinfo_.output_height);
    const int imcu_w = cinfo_.max_h_samp_factor * cinfo_.min_DCT_scaled_size;
    const int imcu_h = cinfo_.max_v_samp_factor * cinfo_.min_DCT_scaled_size;
    JDIMENSION x = static_cast<JDIMENSION>(std::max(left - imcu_w, 0));
    JDIMENSION w = static_cast<JDIMENSION>(std::min(right + imcu_w, width)) - x;
    if (w < static_cast<JDIMENSION>(width)) jpeg_crop_scanline(&cinfo_, &x, &w);
    const int first = std::max(top - imcu_h, 0);
    const int last = std::min(bottom + imcu_h, height);
    row0 = first;
    col0 = static_cast<int>(x);
    cols = static_cast<int>(w);
    rgb.resize(static_cast<std::size_t>(last - first) * w * 3);
    if (first > 0) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(first));
    while (cinfo_.output_scanline < static_cast<JDIMENSION>(last)) {
      JSAMPROW row =
          rgb.data() + (static_cast<std::size_t>(cinfo_.output_scanline) - first) * w * 3;
      jpeg_read_scanlines(&cinfo_, &row, 1);
    }
    if (cinfo_.output_scanline < cinfo_.output_height)
      jpeg_skip_scanlines(&cinfo_, cinfo_.output_height - cinfo_.output_scanline);
    jpeg_finish_decompress(&cinfo_);
    return true;
  }

  [[nodiscard]] const char* message() const { return error_.message.data(); }

private:
  bool fail() {
    jpeg_abort_decompress(&cinfo_);
    return false;
  }

  jpeg_decompress_struct cinfo_{};
  JpegError error_;
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

namespace {

// PIL's fixed point for 8-bit resampling (Resample.c): 22 fraction bits, round half away from 0.
// The resample's loops vectorize: with GCC it is built for AVX-512 (x86-64-v4) and AVX2 beside the
// baseline, the loader picking the widest this CPU has when it is loaded (function
// multiversioning); integer arithmetic, so every build gives the same bytes. Not under the
// sanitizers: the clones' resolver runs before their runtimes are up (a TSan build crashed at
// start).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) &&                             \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define KD_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define KD_VECTOR_CLONES
#endif

constexpr int kPrecisionBits = 32 - 8 - 2;

// A fixed-point sum back to 8 bits (an arithmetic shift keeps a negative sum negative: 0).
std::uint8_t clip8(std::int32_t v) {
  return static_cast<std::uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255));
}

// The taps of one axis in PIL's fixed point (normalize_coeffs_8bpc). Returns the taps' stride.
int axis_taps(int in, int out, ResampleTaps& taps, std::vector<int>& bounds,
              std::vector<std::int32_t>& k) {
  triangle_taps(in, out, taps);
  bounds.resize(static_cast<std::size_t>(out) * 2);
  k.resize(taps.w.size());
  for (std::size_t i = 0; i < taps.w.size(); ++i) {
    const double v = taps.w[i] * (1 << kPrecisionBits);
    k[i] = static_cast<std::int32_t>(v < 0 ? v - 0.5 : v + 0.5);
  }
  for (std::size_t o = 0; o < static_cast<std::size_t>(out); ++o) {
    bounds[o * 2] = taps.first[o];
    bounds[o * 2 + 1] = taps.count[o];
  }
  return taps.k;
}

// Python's round(): half to even (the default rounding mode's nearbyint).
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

} // namespace

CropBox random_resized_crop_box(int h, int w, const ResizedCropRange& range, std::uint64_t key,
                                std::vector<double>* draws) {
  std::uint64_t k = 0;
  const auto uniform = [&] {
    const double u = static_cast<double>(splitmix64(key + k++) >> 11) * 0x1.0p-53;
    if (draws != nullptr) draws->push_back(u);
    return u;
  };
  // torchvision draws in float32 (torch.empty(1).uniform_, its log and exp of the ratio range):
  // each value is rounded to float as it does, the rest is Python's double arithmetic.
  const auto uniform_in = [&](float lo, float hi) {
    return static_cast<float>(static_cast<double>(lo) +
                              (static_cast<double>(hi) - static_cast<double>(lo)) * uniform());
  };
  const double area = static_cast<double>(h) * w;
  const float lr0 = std::log(range.ratio_lo), lr1 = std::log(range.ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * static_cast<double>(uniform_in(range.scale_lo, range.scale_hi));
    const double aspect = static_cast<double>(std::exp(uniform_in(lr0, lr1)));
    const int cw = py_round(std::sqrt(target * aspect)), ch = py_round(std::sqrt(target / aspect));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      // torch.randint(0, n): a uniform integer in [0, n)
      const int top = std::min(static_cast<int>(uniform() * (h - ch + 1)), h - ch);
      const int left = std::min(static_cast<int>(uniform() * (w - cw + 1)), w - cw);
      return {top, left, ch, cw};
    }
  }
  // The fallback: the largest centred box within the ratio range.
  const double in_ratio = static_cast<double>(w) / h;
  int cw = w, ch = h;
  if (in_ratio < range.ratio_lo) {
    ch = py_round(w / static_cast<double>(range.ratio_lo));
  } else if (in_ratio > range.ratio_hi) {
    cw = py_round(h * static_cast<double>(range.ratio_hi));
  }
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

KD_VECTOR_CLONES void resample_bilinear_aa(const std::uint8_t* src, int stride, int x0, int y0,
                                           int w, int h, int out_h, int out_w, int oy, int ox,
                                           int size, std::uint8_t* out, ResampleScratch& m) {
  const int kx = axis_taps(w, out_w, m.taps, m.xbounds, m.xk);
  const int ky = axis_taps(h, out_h, m.taps, m.ybounds, m.yk);
  const bool horizontal = out_w != w, vertical = out_h != h;
  // The source rows the window's outputs read (PIL's ybox_first..ybox_last, for the window only).
  const int first = vertical ? m.ybounds[static_cast<std::size_t>(oy) * 2] : oy;
  const int last = vertical ? m.ybounds[static_cast<std::size_t>(oy + size - 1) * 2] +
                                  m.ybounds[static_cast<std::size_t>(oy + size - 1) * 2 + 1]
                            : oy + size;
  const int rows = last - first;
  // Horizontal pass, 8-bit, over the window's columns and the rows it needs: rows x size x 3.
  m.rows.resize(static_cast<std::size_t>(rows) * size * 3);
  for (int r = 0; r < rows; ++r) {
    // The row; columns are indexed from the region's x0, which may lie left of `src`'s first.
    const std::uint8_t* in = src + static_cast<std::size_t>(y0 + first + r) * stride * 3;
    std::uint8_t* row = m.rows.data() + static_cast<std::size_t>(r) * size * 3;
    for (int x = 0; x < size; ++x) {
      const auto xx = static_cast<std::size_t>(ox + x);
      if (!horizontal) {
        std::memcpy(row + x * 3, in + static_cast<std::size_t>(x0 + ox + x) * 3, 3);
        continue;
      }
      const int xmin = m.xbounds[xx * 2], xmax = m.xbounds[xx * 2 + 1];
      const std::int32_t* k = m.xk.data() + xx * static_cast<std::size_t>(kx);
      std::int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      const std::uint8_t* p = in + static_cast<std::size_t>(x0 + xmin) * 3;
      for (int t = 0; t < xmax; ++t) {
        s0 += p[t * 3] * k[t];
        s1 += p[t * 3 + 1] * k[t];
        s2 += p[t * 3 + 2] * k[t];
      }
      row[x * 3] = clip8(s0);
      row[x * 3 + 1] = clip8(s1);
      row[x * 3 + 2] = clip8(s2);
    }
  }
  // Vertical pass into the planar window: each output row is a weighted sum of whole source rows
  // (interleaved, the window's columns), accumulated over their length so the loops vectorize,
  // then split into the three planes. Integer sums: the order does not change them.
  const std::size_t plane = static_cast<std::size_t>(size) * size;
  const std::size_t n = static_cast<std::size_t>(size) * 3;
  m.acc.resize(n);
  for (int y = 0; y < size; ++y) {
    const auto yy = static_cast<std::size_t>(oy + y);
    const int ymin = vertical ? m.ybounds[yy * 2] - first : oy + y - first;
    const int ymax = vertical ? m.ybounds[yy * 2 + 1] : 1;
    const std::int32_t* k = m.yk.data() + yy * static_cast<std::size_t>(ky);
    const std::uint8_t* first_row = m.rows.data() + static_cast<std::size_t>(ymin) * n;
    std::uint8_t* r = out + static_cast<std::size_t>(y) * size;
    std::uint8_t* g = r + plane;
    std::uint8_t* b = g + plane;
    if (!vertical) {
      for (int x = 0; x < size; ++x) {
        r[x] = first_row[x * 3];
        g[x] = first_row[x * 3 + 1];
        b[x] = first_row[x * 3 + 2];
      }
      continue;
    }
    std::int32_t* acc = m.acc.data();
    std::fill_n(acc, n, std::int32_t{1} << (kPrecisionBits - 1));
    for (int t = 0; t < ymax; ++t) {
      const std::uint8_t* src_row = first_row + static_cast<std::size_t>(t) * n;
      const std::int32_t kt = k[t];
      for (std::size_t i = 0; i < n; ++i) acc[i] += src_row[i] * kt;
    }
    for (int x = 0; x < size; ++x) {
      r[x] = clip8(acc[x * 3]);
      g[x] = clip8(acc[x * 3 + 1]);
      b[x] = clip8(acc[x * 3 + 2]);
    }
  }
}

// How a decoded image becomes the crop: `box` (in the file's pixels) is resized to out_h x out_w,
// of which the size x size window at (oy, ox) is kept.
struct CropPlan {
  CropBox box;
  int out_h = 0, out_w = 0, oy = 0, ox = 0, size = 0;
};

// The decoded pixels: the image is dh x dw (a DCT-scaled JPEG's fewer than the file's h x w), of
// which `rgb` holds rows from `top` and columns [left, left + stride) (a JPEG: the region the
// crop reads; a PNG: all of it).
struct DecodedRegion {
  CropPlan plan;
  int h = 0, w = 0, dh = 0, dw = 0;
  int top = 0, left = 0, stride = 0;
};

// The plan's box in the decoded pixels: rows [y0, y0 + height), columns [x0, x0 + width), at least
// one of each.
struct DecodedBox {
  int y0 = 0, x0 = 0, height = 0, width = 0;
};
DecodedBox box_in_decoded(const DecodedRegion& d) {
  const auto scaled = [](int v, int decoded, int original) {
    return static_cast<int>(std::lround(static_cast<double>(v) * decoded / original));
  };
  const CropBox& box = d.plan.box;
  const int x0 = std::min(scaled(box.left, d.dw, d.w), d.dw - 1);
  const int y0 = std::min(scaled(box.top, d.dh, d.h), d.dh - 1);
  const int x1 = std::max(scaled(box.left + box.width, d.dw, d.w), x0 + 1);
  const int y1 = std::max(scaled(box.top + box.height, d.dh, d.h), y0 + 1);
  return {y0, x0, std::min(y1, d.dh) - y0, std::min(x1, d.dw) - x0};
}

// The source rows (or columns) [first, last) that the outputs [o, o + n) of a resize from `in` to
// `out` samples read (PIL's bilinear support, widened by the downscale factor), a sample more on
// each side for rounding.
std::pair<int, int> source_span(int in, int out, int o, int n) {
  const double scale = static_cast<double>(in) / out;
  const double support = std::max(scale, 1.0);
  const int first = static_cast<int>(std::floor((o + 0.5) * scale - support)) - 1;
  const int last = static_cast<int>(std::ceil((o + n - 0.5) * scale + support)) + 2;
  return {std::clamp(first, 0, in), std::clamp(last, 0, in)};
}

struct ImageDecoder::Impl {
  JpegDecompressor jpeg;
  std::vector<std::uint8_t> file, rgb;
  ResampleScratch resample;

  // Decodes `path` (already in `file`) to interleaved RGB in `rgb`: the plan `plan_of` makes for
  // the file's height and width, and where the decoded pixels lie. A JPEG is decoded with the
  // smallest DCT scaling that keeps the plan's box at least as large as what it becomes (where
  // `dct_scaling` allows it), and only around what the crop reads.
  template <typename PlanOf>
  DecodedRegion decode_rgb(const std::string& path, const PlanOf& plan_of, bool dct_scaling,
                           bool region) {
    switch (kind_of(file.data(), file.size())) {
    case ImageKind::jpeg: return decode_jpeg(path, plan_of, dct_scaling, region);
    case ImageKind::png: {
      const auto [h, w] = decode_png(path);
      return {plan_of(h, w), h, w, h, w, 0, 0, w};
    }
    case ImageKind::other: break;
    }
    throw InputError(fmt::format("{}: not a JPEG or PNG file (its first bytes)", path));
  }

  template <typename PlanOf>
  DecodedRegion decode_jpeg(const std::string& path, const PlanOf& plan_of, bool dct_scaling,
                            bool region) {
    int w = 0, h = 0;
    if (!jpeg.header(file.data(), file.size(), w, h))
      throw InputError(fmt::format("{}: undecodable JPEG ({})", path, jpeg.message()));
    check_pixels(path, w, h);
    DecodedRegion d;
    d.plan = plan_of(h, w);
    d.h = h;
    d.w = w;
    const CropPlan& plan = d.plan;
    // The smallest scaled size that is still large enough, among 1/2, 1/4 and 1/8 (PIL's draft
    // sizes: libjpeg-turbo's other factors are not exact DCT reductions); libjpeg rounds a scaled
    // side up.
    int denom = 1;
    for (const int k : {2, 4, 8}) {
      const auto fits = [&](int part, int want) {
        return std::int64_t{part} >= std::int64_t{want} * k;
      };
      if (dct_scaling && fits(plan.box.height, plan.out_h) && fits(plan.box.width, plan.out_w))
        denom = k;
    }
    d.dh = (h + denom - 1) / denom;
    d.dw = (w + denom - 1) / denom;
    // What the crop reads, in the decoded pixels: the box (RandomResizedCrop reads nothing
    // outside it) and, within it, the window's own source rows and columns.
    const DecodedBox b = box_in_decoded(d);
    auto [ry0, ry1] = source_span(b.height, plan.out_h, plan.oy, plan.size);
    auto [rx0, rx1] = source_span(b.width, plan.out_w, plan.ox, plan.size);
    if (!region) {
      std::tie(ry0, ry1) = std::pair{-b.y0, d.dh - b.y0};
      std::tie(rx0, rx1) = std::pair{-b.x0, d.dw - b.x0};
    }
    if (!jpeg.region(denom, b.y0 + ry0, b.y0 + ry1, b.x0 + rx0, b.x0 + rx1, rgb, d.top, d.left,
                     d.stride))
      throw InputError(fmt::format("{}: undecodable JPEG ({})", path, jpeg.message()));
    return d;
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
};

ImageDecoder::ImageDecoder() : impl_(std::make_unique<Impl>()) {}
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

namespace {

// An image's size after torchvision's Resize(resize): the shorter side `resize`, the longer one
// int(resize * long / short) (truncated, as torchvision computes it).
std::pair<int, int> resized_size(int h, int w, int resize) {
  if (h <= w) return {resize, static_cast<int>(static_cast<std::int64_t>(resize) * w / h)};
  return {static_cast<int>(static_cast<std::int64_t>(resize) * h / w), resize};
}

} // namespace

ImageDecoder::Decoded ImageDecoder::decode(const std::string& path, const ImageGeometry& g,
                                           CropPosition crop, std::uint8_t* out) {
  if (g.size < 1 || g.resize < g.size)
    throw std::invalid_argument(
        fmt::format("image geometry: resize {} < size {}", g.resize, g.size));
  Impl& m = *impl_;
  read_whole(path, m.file, std::numeric_limits<std::size_t>::max());
  const bool resized_crop = crop.random && g.random_resized;
  const auto plan_of = [&](int h, int w) {
    CropPlan p;
    p.size = g.size;
    if (resized_crop) {
      p.box = random_resized_crop_box(h, w, g.range, crop.key);
      p.out_h = p.out_w = g.size;
      return p;
    }
    // Resize(resize), then the crop at its position (CenterCrop's int(round(room / 2)) centred).
    p.box = {0, 0, h, w};
    std::tie(p.out_h, p.out_w) = resized_size(h, w, g.resize);
    p.oy = py_round(std::clamp(crop.y, 0.f, 1.f) * static_cast<double>(p.out_h - g.size));
    p.ox = py_round(std::clamp(crop.x, 0.f, 1.f) * static_cast<double>(p.out_w - g.size));
    return p;
  };
  const DecodedRegion d = m.decode_rgb(path, plan_of, g.dct_scaling, g.region_decode);
  const DecodedBox b = box_in_decoded(d);
  resample_bilinear_aa(m.rgb.data(), d.stride, b.x0 - d.left, b.y0 - d.top, b.width, b.height,
                       d.plan.out_h, d.plan.out_w, d.plan.oy, d.plan.ox, g.size, out, m.resample);
  return {d.h, d.w, d.plan.box};
}

} // namespace kdflow
