// Bilinear taps, box factors and the teacher's input adapter (image_adapter.hpp): per plane, a box
// reduction into scratch when the downscale asks for one, then two taps a row and two a column.
#include "kdflow/core/image_adapter.hpp"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow {

void linear_taps(int in, int scaled, int offset, int count, LinearTaps& out) {
  const auto n = static_cast<std::size_t>(count);
  out.lo.resize(n);
  out.hi.resize(n);
  out.frac.resize(n);
  const float step = static_cast<float>(in) / static_cast<float>(scaled);
  for (std::size_t i = 0; i < n; ++i) {
    const float f =
        std::clamp((static_cast<float>(offset + static_cast<int>(i)) + 0.5f) * step - 0.5f, 0.f,
                   static_cast<float>(in - 1));
    const int lo = static_cast<int>(f);
    out.lo[i] = lo;
    out.hi[i] = std::min(lo + 1, in - 1);
    out.frac[i] = f - static_cast<float>(lo);
  }
}

int box_factor(int in, int out) { return out > 0 && in / out >= 2 ? in / out : 1; }

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
  box_ = std::min(box_factor(from.height, to.height), box_factor(from.width, to.width));
  const int rh = from.height / box_, rw = from.width / box_;
  linear_taps(rh, to.height, 0, to.height, rows_);
  linear_taps(rw, to.width, 0, to.width, cols_);
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
  const int rh = from_.height / box_, rw = from_.width / box_;
  if (box_ > 1) scratch.resize(static_cast<std::size_t>(rh) * rw);
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
      auto resample = [&](const auto* src, int width) {
        for (int y = 0; y < to_.height; ++y) {
          const auto yi = static_cast<std::size_t>(y);
          const auto* r0 = src + static_cast<std::size_t>(rows_.lo[yi]) * width;
          const auto* r1 = src + static_cast<std::size_t>(rows_.hi[yi]) * width;
          const float wy = rows_.frac[yi];
          float* row = dst + yi * static_cast<std::size_t>(to_.width);
          for (int x = 0; x < to_.width; ++x) {
            const auto xi = static_cast<std::size_t>(x);
            const int l = cols_.lo[xi], h = cols_.hi[xi];
            const float fx = cols_.frac[xi];
            const float top = static_cast<float>(r0[l]) +
                              (static_cast<float>(r0[h]) - static_cast<float>(r0[l])) * fx;
            const float bottom = static_cast<float>(r1[l]) +
                                 (static_cast<float>(r1[h]) - static_cast<float>(r1[l])) * fx;
            row[x] = (top + (bottom - top) * wy) * a + b;
          }
        }
      };
      if (box_ == 1) {
        resample(plane, from_.width);
        continue;
      }
      const float area = static_cast<float>(box_ * box_);
      for (int y = 0; y < rh; ++y)
        for (int x = 0; x < rw; ++x) {
          float sum = 0;
          for (int dy = 0; dy < box_; ++dy) {
            const T* row = plane + static_cast<std::size_t>(y * box_ + dy) * from_.width +
                           static_cast<std::size_t>(x * box_);
            for (int dx = 0; dx < box_; ++dx) sum += static_cast<float>(row[dx]);
          }
          scratch[static_cast<std::size_t>(y) * rw + x] = sum / area;
        }
      resample(scratch.data(), rw);
    }
}

} // namespace kdflow
