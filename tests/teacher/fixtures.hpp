// The teacher fixtures the tests share: KDFLOW_FIXTURES (set by ctest) holds models/ (PyTorch
// exports with PyTorch's outputs) and ops/ (single ops), each with a manifest.json.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kdflow::test {

inline std::filesystem::path fixture_dir(const char* sub) {
  const char* dir = std::getenv("KDFLOW_FIXTURES");
  if (dir == nullptr) throw std::runtime_error("KDFLOW_FIXTURES is not set (ctest sets it)");
  return std::filesystem::path(dir) / sub;
}

inline nlohmann::json manifest(const std::filesystem::path& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}

// max |a - ref| / max |ref|
inline double normalized_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, scale = 1e-30;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::abs(double(ref[i])));
    if (a[i] == ref[i] || (std::isnan(a[i]) && std::isnan(ref[i]))) continue;
    // A NaN where the reference has a number (an element never written, say) is an error of its
    // own: std::max would pass over it.
    const double d = std::abs(double(a[i]) - ref[i]);
    if (!(d <= diff)) diff = std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
  }
  return diff / scale;
}

// sqrt(sum (a - ref)^2 / sum ref^2): the error's RMS relative to the logits'. A NaN anywhere reads
// as infinite. Unlike the largest element's error, it does not hang on one draw's widest logit.
inline double relative_rms_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double error = 0, size = 1e-30;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    error += d * d;
    size += double(ref[i]) * ref[i];
  }
  return std::sqrt(error / size);
}

// The error's sum along each reference value's sign, over the values' summed magnitude: near 0
// where a conversion rounds to nearest (no bias), negative where it truncates toward zero.
inline double rounding_bias(const std::vector<float>& a, const std::vector<float>& ref) {
  double along = 0, magnitude = 1e-30;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    along += (double(a[i]) - ref[i]) * ((ref[i] > 0) - (ref[i] < 0));
    magnitude += std::fabs(ref[i]);
  }
  return along / magnitude;
}

} // namespace kdflow::test
