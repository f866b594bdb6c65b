// torchvision's ColorJitter on uint8 images, operation for operation (see color_jitter.hpp). Built
// with floating-point contraction off (core/CMakeLists.txt): a fused multiply-add would round
// differently from PyTorch's separate multiply and add, and a truncation to uint8 would show it.
#include "kdflow/core/color_jitter.hpp"

#include "kdflow/core/digest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

namespace kdflow {
namespace {

// Uniform in [0, 1) from a 64-bit value.
double unit(std::uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

// torch.empty(1).uniform_(lo, hi) as a float32.
float uniform(std::uint64_t x, double lo, double hi) {
  return static_cast<float>(lo + (hi - lo) * unit(x));
}

std::uint8_t to_u8(float v) { // .clamp(0, 255).to(torch.uint8): truncation
  return static_cast<std::uint8_t>(std::min(255.f, std::max(0.f, v)));
}

// _blend(img, other, ratio): ratio * img + (1.0 - ratio) * other, the second factor computed in
// double as Python computes it, each product in float32.
struct Blend {
  float ratio, rest;
  explicit Blend(float r) : ratio(r), rest(static_cast<float>(1.0 - static_cast<double>(r))) {}
  [[nodiscard]] std::uint8_t operator()(std::uint8_t x, float other) const {
    const float a = ratio * static_cast<float>(x);
    const float b = rest * other;
    return to_u8(a + b);
  }
};

// rgb_to_grayscale: (0.2989 * r + 0.587 * g + 0.114 * b).to(torch.uint8).
std::uint8_t grey(std::uint8_t r, std::uint8_t g, std::uint8_t b) {
  const float v = 0.2989f * static_cast<float>(r) + 0.587f * static_cast<float>(g);
  return static_cast<std::uint8_t>(v + 0.114f * static_cast<float>(b));
}

void brightness(std::uint8_t* image, std::size_t values, float factor) {
  const Blend blend(factor);
  for (std::size_t i = 0; i < values; ++i) image[i] = blend(image[i], 0.f);
}

// The mean (grey's, for RGB) in float32: a sum of integers, exact below 2^24, over the pixels.
void contrast(std::uint8_t* image, int channels, std::size_t plane, float factor) {
  double sum = 0;
  if (channels == 3) {
    for (std::size_t i = 0; i < plane; ++i)
      sum += grey(image[i], image[plane + i], image[2 * plane + i]);
  } else {
    for (std::size_t i = 0; i < plane; ++i) sum += image[i];
  }
  const float mean = static_cast<float>(sum) / static_cast<float>(plane);
  const Blend blend(factor);
  const std::size_t values = plane * static_cast<std::size_t>(channels);
  for (std::size_t i = 0; i < values; ++i) image[i] = blend(image[i], mean);
}

void saturation(std::uint8_t* image, std::size_t plane, float factor) {
  const Blend blend(factor);
  std::uint8_t* r = image;
  std::uint8_t* g = image + plane;
  std::uint8_t* b = image + 2 * plane;
  for (std::size_t i = 0; i < plane; ++i) {
    const auto l = static_cast<float>(grey(r[i], g[i], b[i]));
    r[i] = blend(r[i], l);
    g[i] = blend(g[i], l);
    b[i] = blend(b[i], l);
  }
}

// adjust_hue: to float in [0, 1] (x / 255), _rgb2hsv, h = (h + factor) % 1.0, _hsv2rgb, back to
// uint8 as convert_image_dtype does (x * 255.999, truncated).
void hue(std::uint8_t* image, std::size_t plane, float factor) {
  constexpr float kToU8 = static_cast<float>(255.0 + 1.0 - 1e-3);
  std::uint8_t* pr = image;
  std::uint8_t* pg = image + plane;
  std::uint8_t* pb = image + 2 * plane;
  for (std::size_t i = 0; i < plane; ++i) {
    const float r = static_cast<float>(pr[i]) / 255.f;
    const float g = static_cast<float>(pg[i]) / 255.f;
    const float b = static_cast<float>(pb[i]) / 255.f;
    // _rgb2hsv
    const float maxc = std::max(std::max(r, g), b);
    const float minc = std::min(std::min(r, g), b);
    const bool eqc = maxc == minc;
    const float cr = maxc - minc;
    const float s = cr / (eqc ? 1.f : maxc);
    const float div = eqc ? 1.f : cr;
    const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
    const float hr = maxc == r ? bc - gc : 0.f;
    const float hg = maxc == g && maxc != r ? (2.f + rc) - bc : 0.f;
    const float hb = maxc != g && maxc != r ? (4.f + gc) - rc : 0.f;
    float h = (hr + hg) + hb;
    h = std::fmod(h / 6.f + 1.f, 1.f);
    // (h + factor) % 1.0: Python's modulo, the sign of the divisor
    h = std::fmod(h + factor, 1.f);
    if (h < 0) h += 1.f;
    const float v = maxc;
    // _hsv2rgb
    const float i6 = std::floor(h * 6.f);
    const float f = h * 6.f - i6;
    int sector = static_cast<int>(i6) % 6;
    if (sector < 0) sector += 6;
    const float p = std::clamp(v * (1.f - s), 0.f, 1.f);
    const float q = std::clamp(v * (1.f - s * f), 0.f, 1.f);
    const float t = std::clamp(v * (1.f - s * (1.f - f)), 0.f, 1.f);
    float out_r = v, out_g = t, out_b = p;
    switch (sector) {
    case 0: out_r = v, out_g = t, out_b = p; break;
    case 1: out_r = q, out_g = v, out_b = p; break;
    case 2: out_r = p, out_g = v, out_b = t; break;
    case 3: out_r = p, out_g = q, out_b = v; break;
    case 4: out_r = t, out_g = p, out_b = v; break;
    default: out_r = v, out_g = p, out_b = q; break;
    }
    pr[i] = static_cast<std::uint8_t>(out_r * kToU8);
    pg[i] = static_cast<std::uint8_t>(out_g * kToU8);
    pb[i] = static_cast<std::uint8_t>(out_b * kToU8);
  }
}

} // namespace

JitterDraw draw_jitter(const JitterRanges& ranges, std::uint64_t key) {
  JitterDraw d;
  if (!ranges.any()) return d;
  d.on = true;
  std::uint64_t state = key;
  const auto next = [&] { return state = splitmix64(state + 0x9e3779b97f4a7c15ull); };
  // The order: a Fisher-Yates shuffle (torch.randperm(4)'s role).
  for (int k = 3; k > 0; --k)
    std::swap(d.order[static_cast<std::size_t>(k)],
              d.order[static_cast<std::size_t>(next() % static_cast<std::uint64_t>(k + 1))]);
  const auto factor = [&](float strength) {
    const std::uint64_t x = next(); // drawn whether on or not: the others' draws stay put
    return strength > 0 ? uniform(x, std::max(0.0, 1.0 - strength), 1.0 + strength) : 1.f;
  };
  d.brightness = factor(ranges.brightness);
  d.contrast = factor(ranges.contrast);
  d.saturation = factor(ranges.saturation);
  const std::uint64_t x = next();
  d.hue = ranges.hue > 0 ? uniform(x, -ranges.hue, ranges.hue) : 0.f;
  d.applies = {ranges.brightness > 0, ranges.contrast > 0, ranges.saturation > 0, ranges.hue > 0};
  return d;
}

void color_jitter(std::uint8_t* image, int channels, int h, int w, const JitterDraw& draw) {
  if (!draw.on) return;
  const std::size_t plane = static_cast<std::size_t>(h) * static_cast<std::size_t>(w);
  const bool rgb = channels == 3;
  for (const int op : draw.order) {
    if (!draw.applies[static_cast<std::size_t>(op)]) continue;
    switch (op) {
    case 0: brightness(image, plane * static_cast<std::size_t>(channels), draw.brightness); break;
    case 1: contrast(image, channels, plane, draw.contrast); break;
    case 2:
      if (rgb) saturation(image, plane, draw.saturation);
      break;
    default:
      if (rgb) hue(image, plane, draw.hue);
      break;
    }
  }
}

} // namespace kdflow
