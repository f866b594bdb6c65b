// Direct convolution in plain loops, accumulated in double: the reference both libraries must
// match.
#include "conv_impls.hpp"

namespace kdflow::coexist {

std::vector<float> reference_conv(const ConvCase& cc, const std::vector<float>& src,
                                  const std::vector<float>& weights) {
  std::vector<float> dst(static_cast<size_t>(cc.n) * cc.k * cc.oh() * cc.ow());
  for (int n = 0; n < cc.n; ++n)
    for (int k = 0; k < cc.k; ++k)
      for (int y = 0; y < cc.oh(); ++y)
        for (int x = 0; x < cc.ow(); ++x) {
          double acc = 0;
          for (int c = 0; c < cc.c; ++c)
            for (int i = 0; i < cc.r; ++i)
              for (int j = 0; j < cc.r; ++j) {
                const int iy = y * cc.stride - cc.pad + i;
                const int ix = x * cc.stride - cc.pad + j;
                if (iy < 0 || iy >= cc.h || ix < 0 || ix >= cc.w) continue;
                acc += double(src[((size_t(n) * cc.c + c) * cc.h + iy) * cc.w + ix]) *
                       weights[((size_t(k) * cc.c + c) * cc.r + i) * cc.r + j];
              }
          dst[((size_t(n) * cc.k + k) * cc.oh() + y) * cc.ow() + x] = float(acc);
        }
  return dst;
}

} // namespace kdflow::coexist
