// The resize taps and the teacher's input adapter (image_adapter.hpp): per plane, the rows pass
// into scratch, then the columns pass.
#include "kdflow/core/image_adapter.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow {

void triangle_taps(int in, int out, ResampleTaps& taps) {
  // PIL's precompute_coeffs with the bilinear filter (support 1), in double.
  const double scale = static_cast<double>(in) / out;
  const double support = std::max(scale, 1.0), inverse = 1.0 / support;
  taps.k = static_cast<int>(std::ceil(support)) * 2 + 1;
  const auto n = static_cast<std::size_t>(out), k = static_cast<std::size_t>(taps.k);
  taps.first.resize(n);
  taps.count.resize(n);
  taps.w.assign(n * k, 0.0);
  for (std::size_t o = 0; o < n; ++o) {
    const double centre = (static_cast<double>(o) + 0.5) * scale;
    const int first = std::max(static_cast<int>(centre - support + 0.5), 0);
    const int count = std::min(static_cast<int>(centre + support + 0.5), in) - first;
    double* w = taps.w.data() + o * k;
    double total = 0;
    for (int t = 0; t < count; ++t) {
      const double x = std::abs((t + first - centre + 0.5) * inverse);
      w[t] = x < 1 ? 1 - x : 0;
      total += w[t];
    }
    if (total != 0)
      for (int t = 0; t < count; ++t) w[t] /= total;
    taps.first[o] = first;
    taps.count[o] = count;
  }
}

ImageAdapter::ImageAdapter(ImageSpec from, Normalization from_norm, ImageSpec to,
                           Normalization to_norm)
    : from_(from), to_(to), from_norm_(std::move(from_norm)), to_norm_(std::move(to_norm)) {
  for (const int side : {from.channels, from.height, from.width, to.channels, to.height, to.width})
    if (side < 1) throw std::invalid_argument("ImageAdapter: empty image shape");
  if (from.channels != to.channels && from.channels != 1)
    throw std::invalid_argument(
        fmt::format("ImageAdapter: {} channels cannot become {}", from.channels, to.channels));
  const auto fc = static_cast<std::size_t>(from.channels),
             tc = static_cast<std::size_t>(to.channels);
  if (from_norm_.mean.size() != fc || from_norm_.std.size() != fc || to_norm_.mean.size() != tc ||
      to_norm_.std.size() != tc)
    throw std::invalid_argument("ImageAdapter: one mean and std per channel");
  triangle_taps(from.height, to.height, rows_);
  triangle_taps(from.width, to.width, cols_);
  for (std::size_t c = 0; c < tc; ++c) {
    const std::size_t s = fc == 1 ? 0 : c;
    const float a = pixel_scale(to_norm_.std[c]),
                b = pixel_shift(to_norm_.mean[c], to_norm_.std[c]);
    pixel_scale_.push_back(a);
    pixel_shift_.push_back(b);
    // x normalized with from: its pixel value is (x - shift) / scale.
    const float fa = pixel_scale(from_norm_.std[s]),
                fb = pixel_shift(from_norm_.mean[s], from_norm_.std[s]);
    float_scale_.push_back(a / fa);
    float_shift_.push_back(b - a * fb / fa);
  }
}

bool ImageAdapter::passes_floats() const { return from_ == to_ && from_norm_ == to_norm_; }

void ImageAdapter::run(const std::uint8_t* in, std::size_t samples, float* out,
                       std::vector<float>& scratch) const {
  run_typed(in, samples, out, scratch, pixel_scale_, pixel_shift_);
}

void ImageAdapter::run(const float* in, std::size_t samples, float* out,
                       std::vector<float>& scratch) const {
  if (passes_floats()) {
    std::copy_n(in, samples * from_.numel(), out);
    return;
  }
  run_typed(in, samples, out, scratch, float_scale_, float_shift_);
}

template <typename T>
void ImageAdapter::run_typed(const T* in, std::size_t samples, float* out,
                             std::vector<float>& scratch, const std::vector<float>& scale,
                             const std::vector<float>& shift) const {
  const std::size_t in_plane = static_cast<std::size_t>(from_.height) * from_.width;
  const std::size_t out_plane = static_cast<std::size_t>(to_.height) * to_.width;
  const auto tw = static_cast<std::size_t>(to_.width);
  if (resizes()) scratch.resize(static_cast<std::size_t>(from_.height) * tw);
  for (std::size_t i = 0; i < samples; ++i)
    for (int c = 0; c < to_.channels; ++c) {
      const auto k = static_cast<std::size_t>(c);
      const std::size_t source = from_.channels == 1 ? 0 : k;
      const T* plane = in + (i * static_cast<std::size_t>(from_.channels) + source) * in_plane;
      float* dst = out + (i * static_cast<std::size_t>(to_.channels) + k) * out_plane;
      const float a = scale[k], b = shift[k];
      if (!resizes()) { // the loader's normalization, value by value
        for (std::size_t p = 0; p < in_plane; ++p) dst[p] = static_cast<float>(plane[p]) * a + b;
        continue;
      }
      // Rows first (every input row to the output's width), then columns, as the decoder.
      const auto ck = static_cast<std::size_t>(cols_.k), rk = static_cast<std::size_t>(rows_.k);
      for (int y = 0; y < from_.height; ++y) {
        const T* row = plane + static_cast<std::size_t>(y) * from_.width;
        float* mid = scratch.data() + static_cast<std::size_t>(y) * tw;
        for (std::size_t x = 0; x < tw; ++x) {
          const double* w = cols_.w.data() + x * ck;
          const T* src = row + cols_.first[x];
          double v = 0;
          for (int t = 0; t < cols_.count[x]; ++t) v += w[t] * static_cast<double>(src[t]);
          mid[x] = static_cast<float>(v);
        }
      }
      for (int y = 0; y < to_.height; ++y) {
        const auto yi = static_cast<std::size_t>(y);
        const double* w = rows_.w.data() + yi * rk;
        const float* src = scratch.data() + static_cast<std::size_t>(rows_.first[yi]) * tw;
        float* row = dst + yi * tw;
        for (std::size_t x = 0; x < tw; ++x) {
          double v = 0;
          for (int t = 0; t < rows_.count[yi]; ++t)
            v += w[t] * static_cast<double>(src[static_cast<std::size_t>(t) * tw + x]);
          row[x] = static_cast<float>(v) * a + b;
        }
      }
    }
}

} // namespace kdflow
