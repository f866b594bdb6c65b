// Convolutions over few input channels as im2col + one matrix product (internal; im2col.cpp).
#pragma once

#include "lowering.hpp"

#include <string>
#include <vector>

namespace kdflow::teacher {

// The im2col way convolution `node` offers ("im2col"), or none: a 2-D convolution of one group
// over fewer input channels than fill one 16-lane vector (an image network's stem: 1 or 3), a
// kernel larger than 1x1, constant weights (and bias), run in fp32 or bf16 (not int8 nor its
// calibration), with a residual summand, if any, lying channels-last in the activation type.
std::vector<std::string> im2col_ways(const Lowering& plan, const Node& node);

// Lowers `node` as im2col + oneDNN's matmul: plain NCHW in, channels-last out.
void im2col_conv(Lowering& plan, const Node& node);

} // namespace kdflow::teacher
