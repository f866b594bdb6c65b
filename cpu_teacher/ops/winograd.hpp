// Winograd's minimal filtering for 3x3 convolutions (internal; winograd.cpp): F(4x4, 3x3) and
// F(2x2, 3x3), the transforms kdflow's own and the products through oneDNN's batched matmul.
#pragma once

#include "lowering.hpp"

#include <string>
#include <vector>

namespace kdflow::teacher {

// The Winograd ways convolution `node` offers ("winograd_4x4", "winograd_2x2"), or none: it must
// be a 3x3 convolution of stride 1 and dilation 1, one group, constant weights (and bias), at
// least 16 input and output channels, run in fp32 (not bf16, not int8 nor its calibration), with
// activations the op table knows as its post-ops and a residual summand, if any, lying
// channels-last in f32.
std::vector<std::string> winograd_ways(const Lowering& plan, const Node& node);

// Lowers `node` as F(m x m, 3x3), m = 4 or 2: channels-last in and out.
void winograd_conv(Lowering& plan, const Node& node, int m);

} // namespace kdflow::teacher
