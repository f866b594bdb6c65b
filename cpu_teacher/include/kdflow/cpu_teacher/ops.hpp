// The ONNX ops kdflow's teacher reads, as other executors of its graph need to know them (the
// LibTorch teacher in gpu_student): their names, which of them can remain in an imported graph,
// and the parameters of an activation. No oneDNN and no torch here.
#pragma once

#include "kdflow/cpu_teacher/graph.hpp"

#include <string>
#include <vector>

namespace kdflow::teacher {

struct OpInfo {
  std::string name; // ONNX op type
  // True: a node of this op can remain in the graph after import, for an executor to run per
  // batch (the oneDNN engine may still refuse a variant: BatchNormalization with computed
  // parameters). False: the op is only folded at import (Shape, Gather, Cast, ...); a graph that
  // would run it is refused.
  bool runs_at_inference = false;
};

// Every op of the teacher's op table, sorted by name.
std::vector<OpInfo> teacher_ops();

// An activation node (Relu, Clip, ...) as the eltwise post-op it becomes when fused: its op and
// its alpha / beta (Clip's min / max) as the node holds them after import.
PostOp activation_post_op(const Node& activation);

// Where a Resize node (after import) samples along one spatial axis (0: rows, 1: columns): output
// position o reads source positions lo[o] and hi[o] blended as src[lo] + (src[hi] - src[lo]) *
// w[o] (nearest: lo = hi, w = 0). Every executor of the graph samples with these.
struct ResizeTaps {
  std::vector<std::int64_t> lo, hi;
  std::vector<float> w;
};
ResizeTaps resize_taps(const Node& resize, const Shape& in, const Shape& out, int axis);

} // namespace kdflow::teacher
