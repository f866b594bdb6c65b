// Graph passes run at load, after constant folding: no-op removal (Identity, Dropout, Flatten and
// Reshape that change nothing), BatchNormalization folded into the preceding convolution (or,
// alone, turned into a depthwise 1x1 convolution), kernel taps that only read padding cut off,
// residual adds fused as sum post-ops and activations as eltwise post-ops of the convolution or
// matrix product before them. (How each node then runs is the lowering's and the tuner's choice.)
#pragma once

#include "kdflow/cpu_teacher/graph.hpp"

#include <cstdint>
#include <string>

namespace kdflow::teacher {

void run_passes(Graph& graph);

struct GraphSummary {
  std::size_t nodes = 0;
  std::size_t fused_post_ops = 0;
  std::int64_t parameters = 0; // constants read by the remaining nodes
  double flops_per_sample = 0; // multiply-adds counted as 2
};

GraphSummary summarize(const Graph& graph);
// The graph after the passes, one node a line with its fused post-ops and output shape.
std::string describe_graph(const Graph& graph);

} // namespace kdflow::teacher
