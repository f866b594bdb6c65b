// Resampling shared by the image decoder and the teacher's input: PIL's antialiased bilinear taps;
// and ImageAdapter, which makes a teacher's own input (its size, channels and normalization) from
// the images a slot holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kdflow {

// Normalization as one multiply and add per pixel value x in [0, 255]: x * scale + shift =
// (x / 255 - mean) / std. The one formula the loader, the teacher's input and the student's
// device use.
inline float pixel_scale(float std) { return 1.f / (255.f * std); }
inline float pixel_shift(float mean, float std) { return -mean / std; }

// The taps of one axis of PIL's antialiased bilinear resize (Image.resize(BILINEAR), what
// torchvision's transforms call, and torch's interpolate(bilinear, antialias = true)): output
// sample o of `out` reads input samples [first[o], first[o] + count[o]) with weights
// w[o * k + t], which sum to one: the triangle filter, widened by the downscale factor.
struct ResampleTaps {
  int k = 0; // the most taps an output sample has (the stride of w)
  std::vector<int> first, count;
  std::vector<double> w;
};
void triangle_taps(int in, int out, ResampleTaps& taps);

struct ImageSpec {
  int channels = 0, height = 0, width = 0;
  [[nodiscard]] std::size_t numel() const {
    return static_cast<std::size_t>(channels) * static_cast<std::size_t>(height) *
           static_cast<std::size_t>(width);
  }
  bool operator==(const ImageSpec&) const = default;
};

struct Normalization {
  std::vector<float> mean, std; // one per channel
  bool operator==(const Normalization&) const = default;
};

// Images of `from` (uint8 pixels, or float32 normalized with `from_norm`) to images of `to`
// normalized with `to_norm`: resized to to's size with the decoder's taps (triangle_taps, rows then
// columns), channel 0 repeated when `from` has one channel and `to` more, then the normalization.
// The values are kept in float32 (no rounding to 8 bits between the passes). A uint8 image of the
// same size and normalization comes out exactly as the loader's float32 slots would hold it.
class ImageAdapter {
public:
  // std::invalid_argument for empty shapes, channels that neither match nor repeat one, or
  // normalizations of the wrong length.
  ImageAdapter(ImageSpec from, Normalization from_norm, ImageSpec to, Normalization to_norm);

  // `samples` images of from() -> of to(); `scratch` holds the first pass (grown once).
  void run(const std::uint8_t* in, std::size_t samples, float* out,
           std::vector<float>& scratch) const;
  void run(const float* in, std::size_t samples, float* out, std::vector<float>& scratch) const;

  // Float32 images of from() need nothing done: they are the teacher's input as they are.
  [[nodiscard]] bool passes_floats() const;
  [[nodiscard]] bool resizes() const {
    return from_.height != to_.height || from_.width != to_.width;
  }
  [[nodiscard]] const ImageSpec& from() const { return from_; }
  [[nodiscard]] const ImageSpec& to() const { return to_; }
  [[nodiscard]] const Normalization& to_norm() const { return to_norm_; }
  // Output channel c = value * scale + shift of the resampled input channel (c, or 0 when
  // repeated), for float32 input normalized with from_norm.
  [[nodiscard]] const std::vector<float>& float_scale() const { return float_scale_; }
  [[nodiscard]] const std::vector<float>& float_shift() const { return float_shift_; }

private:
  template <typename T>
  void run_typed(const T* in, std::size_t samples, float* out, std::vector<float>& scratch,
                 const std::vector<float>& scale, const std::vector<float>& shift) const;

  ImageSpec from_, to_;
  Normalization from_norm_, to_norm_;
  ResampleTaps rows_, cols_;
  std::vector<float> pixel_scale_, pixel_shift_; // uint8 input
  std::vector<float> float_scale_, float_shift_; // float32 input normalized with from_norm
};

} // namespace kdflow
