// The teacher's graph as kdflow holds it: ONNX nodes in topological order, constants (initializers
// and folded values) with their data, and a static shape for every value at the batch size chosen
// at load. No oneDNN and no protobuf here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kdflow::teacher {

using Shape = std::vector<std::int64_t>;

std::int64_t numel(const Shape& shape);
std::string format_shape(const Shape& shape);

enum class ElemType { f32, i64 };

// A constant tensor (weights, folded shape arithmetic). Exactly one of f / i holds the data.
struct Tensor {
  ElemType type = ElemType::f32;
  Shape shape;
  std::vector<float> f;
  std::vector<std::int64_t> i;

  static Tensor floats(Shape shape, std::vector<float> data);
  static Tensor ints(Shape shape, std::vector<std::int64_t> data);
  [[nodiscard]] std::int64_t size() const { return numel(shape); }
  // Value k as a double / int64, whatever the element type.
  [[nodiscard]] double at(std::int64_t k) const;
  [[nodiscard]] std::int64_t int_at(std::int64_t k) const;
  [[nodiscard]] std::vector<std::int64_t> as_ints() const;
};

struct Attribute {
  enum class Kind { none, i, f, s, ints, floats, tensor } kind = Kind::none;
  std::int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<std::int64_t> ints;
  std::vector<float> floats;
  std::optional<Tensor> t;
};

// Attributes of one value (the passes' and the exported student's nodes).
Attribute ints_attribute(std::vector<std::int64_t> v);
Attribute float_attribute(float v);
Attribute int_attribute(std::int64_t v);

// An elementwise activation fused after a convolution or matrix product (oneDNN eltwise post-op),
// or the residual sum (oneDNN sum post-op, `sum_input` accumulated in place).
struct PostOp {
  enum class Kind { eltwise, sum } kind = Kind::eltwise;
  std::string op; // ONNX op type of the fused activation ("Relu", "Clip", ...)
  float alpha = 0, beta = 0;
  std::string sum_input;
  std::string fused_node; // the node it came from, for `teacher info`
};

struct Node {
  std::string op;
  std::string name;
  std::vector<std::string> inputs; // "" for an omitted optional input
  std::vector<std::string> outputs;
  std::map<std::string, Attribute> attrs;
  std::vector<PostOp> post_ops;

  [[nodiscard]] bool has(const std::string& attr) const { return attrs.count(attr) != 0; }
  [[nodiscard]] std::int64_t int_attr(const std::string& attr, std::int64_t fallback) const;
  [[nodiscard]] float float_attr(const std::string& attr, float fallback) const;
  [[nodiscard]] std::string string_attr(const std::string& attr, const std::string& fallback) const;
  [[nodiscard]] std::vector<std::int64_t> ints_attr(const std::string& attr,
                                                    std::vector<std::int64_t> fallback = {}) const;
  // "Conv 'resnet.layer1.0.conv1'" for error messages.
  [[nodiscard]] std::string describe() const;
};

struct Graph {
  std::string file;
  std::int64_t opset = 0;
  std::int64_t batch = 0; // the batch every shape here is for
  // A model that fixes its batch inside (an exporter's static Reshape or Expand) runs a teacher
  // batch as `chunks` runs of `batch` samples; 1 otherwise.
  std::int64_t chunks = 1;
  std::string input; // the one non-constant graph input
  Shape input_shape; // with the batch dimension set
  std::vector<std::string> outputs;
  // Values read besides the outputs (the teacher's features): kept as they are, like outputs,
  // by every pass.
  std::vector<std::string> kept;
  std::vector<Node> nodes; // topological order
  std::map<std::string, Tensor> constants;
  std::map<std::string, Shape> shapes; // every value's static shape
  std::map<std::string, ElemType> types;

  [[nodiscard]] bool is_constant(const std::string& value) const {
    return constants.count(value) != 0;
  }
  [[nodiscard]] const Shape& shape(const std::string& value) const;
  // Nodes that read `value` (indices into nodes): as an input, or as the sum a fused post-op
  // accumulates into; and whether `value` leaves the graph (an output, or a kept value).
  [[nodiscard]] std::vector<std::size_t> consumers(const std::string& value) const;
  // The node that writes `value` (an index into nodes), or -1 (a graph input or a constant).
  [[nodiscard]] int producer(const std::string& value) const;
  [[nodiscard]] bool is_output(const std::string& value) const;
};

// Bounds on a graph once its model-local functions are expanded: functions that call others twice
// over double at each level, so a small file can expand to more nodes than memory holds. The nodes
// are counted before any is copied; the bytes of the nodes copied out of functions (a call's
// attributes, a tensor among them, are copied with each) as they are. The largest vision and
// language models a CPU teacher runs have tens of thousands of nodes, with small attributes; the
// fuzz targets set lower bounds to keep each input's run short.
struct GraphLimits {
  std::size_t max_nodes = std::size_t{1} << 20;
  std::size_t max_function_bytes = std::size_t{256} << 20;
};

struct LoadOptions {
  std::int64_t batch = 64;
  GraphLimits limits;
  // The input's sample dimensions: where sample_shape gives one (> 0), the model's must be that or
  // open (then bound to it); a dimension the model leaves open and sample_shape does not give is
  // bound to sample_default's. `sample_source` names what asked ("teacher.input_size") in errors.
  std::optional<Shape> sample_shape;
  std::optional<Shape> sample_default;
  std::string sample_source;
  bool run_passes = true; // false: the graph as imported (constant folding only)
  // Intermediate values the caller reads (Graph::kept): no pass fuses them away.
  std::vector<std::string> keep;
};

// Reads an ONNX file (external data beside it included; local functions inlined), checks it, and
// returns its graph with shapes for `batch`, constant subgraphs folded and kdflow's passes applied.
// Bad input (unreadable or corrupt file, unsupported opset or op, input rank/shape mismatch) is an
// InputError naming the file, node and op.
Graph load_onnx(const std::string& path, const LoadOptions& options);

// The model of `whole` (imported by load_onnx at options.batch, in one pass) imported again at
// `per_pass` samples, a divisor of options.batch, to run options.batch / per_pass times per batch
// (Graph::chunks), each pass on the next samples: a batch's working set that a smaller pass keeps
// in cache. std::nullopt where the graph does not compute per sample alike at both batches (a
// batch hard-coded in a Reshape, a value whose batch is merged away, an output or kept value not
// led by the batch) or where the model fixes its batch already.
std::optional<Graph> load_onnx_in_passes(const std::string& path, const LoadOptions& options,
                                         const Graph& whole, std::int64_t per_pass);

// Writes `g` (no fused post-ops; shapes for every output) as an ONNX model at opset g.opset, its
// input and outputs with an open batch dimension, constants as initializers; atomically (the
// file is whole or absent). The exported student's writer (onnx_export.cpp).
void write_onnx(const Graph& g, const std::string& path, const std::string& producer);

} // namespace kdflow::teacher
