// One convolution, three implementations, each in its own translation unit so that the torch
// headers (which carry a copy of oneDNN's headers) and the teacher's oneDNN headers never meet.
#pragma once

#include <string>
#include <vector>

namespace kdflow::coexist {

struct ConvCase {
  int n, c, h, w; // input NCHW
  int k, r;       // output channels, square kernel size
  int stride, pad;
  [[nodiscard]] int oh() const { return (h + 2 * pad - r) / stride + 1; }
  [[nodiscard]] int ow() const { return (w + 2 * pad - r) / stride + 1; }
};

// Plain loops: the reference.
std::vector<float> reference_conv(const ConvCase& cc, const std::vector<float>& src,
                                  const std::vector<float>& weights);
// LibTorch's CPU convolution through its own bundled oneDNN (at::mkldnn_convolution).
std::vector<float> torch_mkldnn_conv(const ConvCase& cc, const std::vector<float>& src,
                                     const std::vector<float>& weights);
// Whether LibTorch reports its bundled oneDNN as usable here.
bool torch_has_mkldnn();
// The teacher's oneDNN (PyPI, TBB runtime), layouts chosen by the primitive.
std::vector<float> onednn_conv(const ConvCase& cc, const std::vector<float>& src,
                               const std::vector<float>& weights);
// "3.2.0 TBB": the version and CPU runtime of the oneDNN the teacher's calls reach.
std::string onednn_identity();

} // namespace kdflow::coexist
