// LibTorch side of the coexistence test: a convolution forced through torch's bundled oneDNN.
#include "conv_impls.hpp"

#include <ATen/ATen.h>
#include <torch/torch.h>

namespace kdflow::coexist {

bool torch_has_mkldnn() { return at::hasMKLDNN(); }

std::vector<float> torch_mkldnn_conv(const ConvCase& cc, const std::vector<float>& src,
                                     const std::vector<float>& weights) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  auto x = torch::from_blob(const_cast<float*>(src.data()), {cc.n, cc.c, cc.h, cc.w}, opts);
  auto w = torch::from_blob(const_cast<float*>(weights.data()), {cc.k, cc.c, cc.r, cc.r}, opts);
  torch::NoGradGuard no_grad;
  const auto y = at::mkldnn_convolution(x, w, std::nullopt, {cc.pad, cc.pad},
                                        {cc.stride, cc.stride}, {1, 1}, 1)
                     .contiguous();
  return {y.data_ptr<float>(), y.data_ptr<float>() + y.numel()};
}

} // namespace kdflow::coexist
