// Winograd's minimal filtering for 3x3 and 5x5 convolutions (internal; winograd.cpp): F(4x4, 3x3),
// F(2x2, 3x3), F(4x4, 5x5) and F(2x2, 5x5), the transforms kdflow's own and the
// products through oneDNN's batched matmul.
#pragma once

#include "lowering.hpp"

#include <string>
#include <vector>

namespace kdflow::teacher {

// The Winograd ways convolution `node` offers, named by the output tile ("winograd_4x4",
// "winograd_2x2"), or none: it must be a 3x3 or 5x5 convolution of
// stride 1 and dilation 1, one group, constant weights (and bias), at least 16 input and output
// channels, written channels-last, with activations the op table knows as its post-ops and a
// residual summand, if any: all in fp32, F(2x2, 3x3) in bf16, none in int8 nor its calibration.
std::vector<std::string> winograd_ways(const Lowering& plan, const Node& node);

// Lowers `node` as F(m x m, r x r), m = 4 or 2, r its kernel's size: channels-last in and out.
void winograd_conv(Lowering& plan, const Node& node, int m);

} // namespace kdflow::teacher
