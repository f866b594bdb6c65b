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

} // namespace kdflow::teacher
