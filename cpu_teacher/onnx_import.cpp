// ONNX import: protobuf model -> kdflow Graph with static shapes, local functions inlined,
// constants folded, passes applied. Only this file sees protobuf: it reads the venv onnx wheel's
// onnx.proto (compiled as package kdflow_onnx) and checks what kdflow relies on itself, for every
// IR version that proto knows.
#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow/cpu_teacher/passes.hpp"
#include "kdflow/cpu_teacher/reference.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"
#include "ops/op_table.hpp"

#include <kdflow_onnx.pb.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::teacher {
namespace {

// The most elements one tensor of the graph may have at the load's batch (4 GiB of float32): a CPU
// teacher's largest activations are a few hundred MB at training batches; a model whose shapes
// claim more is refused at load rather than failing to allocate (or being killed) later.
constexpr std::int64_t kMaxTensorElements = std::int64_t{1} << 30;

namespace pb = kdflow_onnx;

constexpr std::int64_t kMinOpset = 11;
// 22: opsets 19 to 22 changed no semantics of an op kdflow runs (they add element types, and
// AveragePool's dilations, which its shape rule reads); 23 brings new ops (Attention, RMSNorm).
constexpr std::int64_t kMaxOpset = 22;
// IR 3 is the first with opset imports; the newest is the one the compiled onnx.proto describes.
constexpr std::int64_t kMinIr = 3;
constexpr std::int64_t kMaxIr = pb::IR_VERSION;
// Local functions calling local functions: deeper than this is a cycle, not a model.
constexpr int kMaxFunctionDepth = 32;

std::string read_bytes(const std::filesystem::path& path, std::int64_t offset = 0,
                       std::int64_t length = -1) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot read the file", path.string()));
  in.seekg(0, std::ios::end);
  const std::int64_t size = in.tellg();
  if (length < 0) length = size - offset;
  if (offset < 0 || offset > size || length > size - offset)
    throw InputError(fmt::format("{}: truncated (wants {} bytes at offset {}, the file has {})",
                                 path.string(), length, offset, size));
  std::string bytes(static_cast<std::size_t>(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  return bytes;
}

// An external-data key's integer value; `what` names the tensor for the error.
std::int64_t external_int(const std::string& value, const std::string& what) {
  std::int64_t v = 0;
  std::size_t used = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || v < 0)
    throw InputError(fmt::format("{}: '{}' is not a byte count", what, value));
  return v;
}

// The model's external data must stay inside its folder, every link resolved.
std::filesystem::path external_path(const std::filesystem::path& model_dir,
                                    const std::string& location, const std::string& what) {
  return confined_file(model_dir, location, fmt::format("{}: external data", what));
}

Tensor to_tensor(const pb::TensorProto& t, const std::filesystem::path& model_dir,
                 const std::string& file) {
  const std::string what = fmt::format("{}: tensor '{}'", file, t.name());
  // The element count, checked before anything is allocated: a header may lie.
  std::int64_t n = 1;
  for (const std::int64_t d : t.dims()) {
    if (d < 0) throw InputError(fmt::format("{} has a negative dimension", what));
    if (d > 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw InputError(fmt::format("{} has more elements than can be addressed", what));
    n *= d;
  }
  Shape shape(t.dims().begin(), t.dims().end());
  std::string raw;
  bool has_raw = false;
  if (t.data_location() == pb::TensorProto::EXTERNAL) {
    std::string location;
    std::int64_t offset = 0, length = -1;
    for (const auto& kv : t.external_data()) {
      if (kv.key() == "location")
        location = kv.value();
      else if (kv.key() == "offset")
        offset = external_int(kv.value(), what);
      else if (kv.key() == "length")
        length = external_int(kv.value(), what);
    }
    raw = read_bytes(external_path(model_dir, location, what), offset, length);
    has_raw = true;
  } else if (t.has_raw_data()) {
    raw = t.raw_data();
    has_raw = true;
  }
  const auto type = t.data_type();
  const std::size_t elem = type == pb::TensorProto::FLOAT || type == pb::TensorProto::INT32    ? 4
                           : type == pb::TensorProto::INT64 || type == pb::TensorProto::DOUBLE ? 8
                           : type == pb::TensorProto::BOOL                                     ? 1
                                                                                               : 0;
  if (elem == 0)
    throw InputError(fmt::format("{} has element type {}, which kdflow does not read", what, type));
  const int typed = type == pb::TensorProto::FLOAT    ? t.float_data_size()
                    : type == pb::TensorProto::INT64  ? t.int64_data_size()
                    : type == pb::TensorProto::DOUBLE ? t.double_data_size()
                                                      : t.int32_data_size(); // INT32, BOOL
  // raw.size() / elem: compared without multiplying n, which may be huge.
  if (has_raw ? raw.size() % elem != 0 || raw.size() / elem != static_cast<std::uint64_t>(n)
              : typed != n)
    throw InputError(fmt::format("{} holds {} values, its shape {} needs {}", what,
                                 has_raw ? raw.size() / elem : static_cast<std::size_t>(typed),
                                 format_shape(shape), n));
  const auto count = static_cast<std::size_t>(n);
  if (type == pb::TensorProto::FLOAT || type == pb::TensorProto::DOUBLE) {
    std::vector<float> v(count);
    if (type == pb::TensorProto::FLOAT && has_raw) {
      if (count > 0) std::memcpy(v.data(), raw.data(), raw.size()); // an empty v has no data()
    } else if (type == pb::TensorProto::FLOAT) {
      std::copy(t.float_data().begin(), t.float_data().end(), v.begin());
    } else if (has_raw) {
      for (std::size_t k = 0; k < count; ++k) {
        double d;
        std::memcpy(&d, raw.data() + 8 * k, 8);
        v[k] = static_cast<float>(d);
      }
    } else {
      std::copy(t.double_data().begin(), t.double_data().end(), v.begin());
    }
    return Tensor::floats(shape, std::move(v));
  }
  std::vector<std::int64_t> v(count);
  if (has_raw) {
    for (std::size_t k = 0; k < count; ++k) {
      if (elem == 8) {
        std::memcpy(&v[k], raw.data() + 8 * k, 8);
      } else if (elem == 4) {
        std::int32_t x;
        std::memcpy(&x, raw.data() + 4 * k, 4);
        v[k] = x;
      } else {
        v[k] = raw[k] != 0;
      }
    }
  } else if (type == pb::TensorProto::INT64) {
    std::copy(t.int64_data().begin(), t.int64_data().end(), v.begin());
  } else {
    std::copy(t.int32_data().begin(), t.int32_data().end(), v.begin());
  }
  return Tensor::ints(shape, std::move(v));
}

Attribute to_attribute(const pb::AttributeProto& a, const std::filesystem::path& dir,
                       const std::string& file) {
  Attribute r;
  switch (a.type()) {
  case pb::AttributeProto::INT:
    r.kind = Attribute::Kind::i;
    r.i = a.i();
    break;
  case pb::AttributeProto::FLOAT:
    r.kind = Attribute::Kind::f;
    r.f = a.f();
    break;
  case pb::AttributeProto::STRING:
    r.kind = Attribute::Kind::s;
    r.s = a.s();
    break;
  case pb::AttributeProto::INTS:
    r.kind = Attribute::Kind::ints;
    r.ints.assign(a.ints().begin(), a.ints().end());
    break;
  case pb::AttributeProto::FLOATS:
    r.kind = Attribute::Kind::floats;
    r.floats.assign(a.floats().begin(), a.floats().end());
    break;
  case pb::AttributeProto::TENSOR:
    r.kind = Attribute::Kind::tensor;
    r.t = to_tensor(a.t(), dir, file);
    break;
  default:
    r.kind = Attribute::Kind::none;
    break; // graphs, sparse tensors: not used by supported ops
  }
  return r;
}

using Nodes = google::protobuf::RepeatedPtrField<pb::NodeProto>;

// Replaces every call of a model-local function (ModelProto.functions, as exporters write modules)
// by the function's body: fresh names for its inner values, the call's inputs, outputs and
// attributes in place of the formal ones. kdflow then sees only ONNX ops.
class Inliner {
public:
  Inliner(const pb::ModelProto& model, std::string file, std::int64_t opset, GraphLimits limits)
      : file_(std::move(file)), limits_(limits) {
    for (const auto& f : model.functions()) {
      for (const auto& imp : f.opset_import())
        if ((imp.domain().empty() || imp.domain() == "ai.onnx") && imp.version() != opset)
          throw InputError(fmt::format("{}: function '{}' imports opset {}, the model {}", file_,
                                       f.name(), imp.version(), opset));
      if (!functions_.emplace(key(f.domain(), f.name(), f.overload()), &f).second)
        throw InputError(fmt::format("{}: function '{}' (domain '{}') is defined twice", file_,
                                     f.name(), f.domain()));
    }
  }

  // The graph's nodes with every call expanded. Their number and the calls' are counted first,
  // each function once, so a file over limits_.max_nodes is refused before anything is copied or
  // expanded (a call is work even where its function has no node); their bytes are counted as
  // they are copied.
  std::vector<pb::NodeProto> flatten(const Nodes& nodes) {
    if (count(nodes, 0) > limits_.max_nodes)
      throw InputError(fmt::format("{}: more than {} nodes and function calls once its functions "
                                   "are expanded",
                                   file_, limits_.max_nodes));
    std::vector<pb::NodeProto> out;
    for (const auto& n : nodes) add(n, 0, out);
    return out;
  }

private:
  using Key = std::tuple<std::string, std::string, std::string>;
  static Key key(const std::string& domain, const std::string& name, const std::string& overload) {
    return {domain == "ai.onnx" ? "" : domain, name, overload};
  }

  const pb::FunctionProto* callee(const pb::NodeProto& node) const {
    const auto f = functions_.find(key(node.domain(), node.op_type(), node.overload()));
    return f == functions_.end() ? nullptr : f->second;
  }

  // The nodes and calls `nodes` expand to, up to limits_.max_nodes + 1, each function counted
  // once; a call cycle or nesting deeper than kMaxFunctionDepth is an InputError.
  std::size_t count(const Nodes& nodes, int depth) {
    std::size_t n = 0;
    for (const auto& node : nodes) {
      std::size_t k = 1;
      if (const pb::FunctionProto* f = callee(node)) {
        if (const auto known = counts_.find(f); known != counts_.end()) {
          k = known->second;
        } else {
          if (!open_.insert(f).second)
            throw InputError(fmt::format("{}: function '{}' calls itself", file_, node.op_type()));
          if (depth >= kMaxFunctionDepth)
            throw InputError(fmt::format("{}: functions nest more than {} deep (at '{}')", file_,
                                         kMaxFunctionDepth, node.op_type()));
          k = 1 + count(f->node(), depth + 1); // the call, and what it expands to
          open_.erase(f);
          counts_.emplace(f, k);
        }
      }
      n = std::min(n + k, limits_.max_nodes + 1);
    }
    return n;
  }

  void add(const pb::NodeProto& node, int depth, std::vector<pb::NodeProto>& out) {
    if (const pb::FunctionProto* f = callee(node)) {
      expand(node, *f, depth, out);
      return;
    }
    // A function's nodes are copied once per call, with the attributes the call passes (a tensor
    // among them): the count of nodes does not bound their bytes. (The graph's own nodes are in
    // the file already.)
    if (depth > 0) {
      bytes_ += node.ByteSizeLong();
      if (bytes_ > limits_.max_function_bytes)
        throw InputError(fmt::format("{}: its functions expand to more than {} bytes of nodes",
                                     file_, limits_.max_function_bytes));
    }
    out.push_back(node);
  }

  void expand(const pb::NodeProto& call, const pb::FunctionProto& f, int depth,
              std::vector<pb::NodeProto>& out) {
    const std::string prefix = fmt::format("kdflow_inline{}/", calls_++);
    std::map<std::string, std::string> names;
    for (int k = 0; k < f.input_size(); ++k)
      names[f.input(k)] = k < call.input_size() ? call.input(k) : "";
    for (int k = 0; k < f.output_size(); ++k)
      if (k < call.output_size()) names[f.output(k)] = call.output(k);
    const auto rename = [&](const std::string& v) {
      if (v.empty()) return v;
      const auto it = names.find(v);
      return it != names.end() ? it->second : prefix + v;
    };
    std::map<std::string, const pb::AttributeProto*> given;
    for (const auto& a : f.attribute_proto()) given[a.name()] = &a; // defaults
    for (const auto& a : call.attribute()) given[a.name()] = &a;
    const std::string caller = call.name().empty() ? call.op_type() : call.name();
    for (const auto& body : f.node()) {
      pb::NodeProto n = body;
      n.set_name(caller + "/" + (body.name().empty() ? body.op_type() : body.name()));
      for (auto& v : *n.mutable_input()) v = rename(v);
      for (auto& v : *n.mutable_output()) v = rename(v);
      n.clear_attribute();
      for (const auto& a : body.attribute()) {
        if (a.ref_attr_name().empty()) {
          *n.add_attribute() = a;
          continue;
        }
        const auto it = given.find(a.ref_attr_name());
        if (it == given.end()) continue; // neither passed nor defaulted: the op's own default
        pb::AttributeProto& copy = *n.add_attribute() = *it->second;
        copy.set_name(a.name());
      }
      add(n, depth + 1, out);
    }
  }

  std::string file_;
  GraphLimits limits_;
  std::map<Key, const pb::FunctionProto*> functions_;
  std::map<const pb::FunctionProto*, std::size_t> counts_;
  std::set<const pb::FunctionProto*> open_; // being counted: a call of one is a cycle
  std::size_t bytes_ = 0;
  int calls_ = 0;
};

pb::ModelProto parse(const std::string& path) {
  const std::filesystem::path file(path);
  // protobuf parses at most 2 GiB - 1: a larger file is refused before it is read.
  const std::string bytes = read_input_file(file, "teacher model", std::numeric_limits<int>::max());
  pb::ModelProto model;
  if (!model.ParseFromString(bytes))
    throw InputError(
        fmt::format("{}: not a valid ONNX model (truncated or corrupt protobuf)", path));
  if (!model.has_graph()) throw InputError(fmt::format("{}: not an ONNX model (no graph)", path));
  if (model.ir_version() < kMinIr || model.ir_version() > kMaxIr)
    throw InputError(fmt::format("{}: IR version {} is not supported (kdflow reads {} to {})", path,
                                 model.ir_version(), kMinIr, kMaxIr));
  return model;
}

// A declared input's sample dimensions, "?" where the model leaves one open.
std::string
dims_text(const google::protobuf::RepeatedPtrField<pb::TensorShapeProto::Dimension>& dims) {
  std::vector<std::string> out;
  for (int d = 1; d < dims.size(); ++d)
    out.push_back(dims[d].has_dim_value() && dims[d].dim_value() > 0
                      ? std::to_string(dims[d].dim_value())
                      : "?");
  return fmt::format("[{}]", fmt::join(out, ", "));
}

// A requested sample shape, "any" where it leaves the dimension to the model.
std::string wanted_text(const Shape& shape) {
  std::vector<std::string> out;
  for (const auto v : shape) out.push_back(v > 0 ? std::to_string(v) : "any");
  return fmt::format("[{}]", fmt::join(out, ", "));
}

// The batch the model's input declares: 0 where it is symbolic (dim_param) or absent.
std::int64_t declared_batch(const pb::ModelProto& model) {
  for (const auto& in : model.graph().input()) {
    bool init = false;
    for (const auto& i : model.graph().initializer()) init = init || i.name() == in.name();
    if (init) continue;
    const auto& dims = in.type().tensor_type().shape().dim();
    return dims.empty() || !dims[0].has_dim_value()
               ? 0
               : std::max<std::int64_t>(0, dims[0].dim_value());
  }
  return 0;
}

// Whether graph `g`, imported at batch g.batch, computes per sample what `fixed` (the same model
// at the batch it declares) does: every value computed from the input has the same shape but for
// one axis (the batch, or a batch merged with another axis) scaled by the ratio of the batches,
// and the graph's outputs lead with it. A graph that hard-codes its batch in a Reshape or Expand
// either fails to import at another batch or leaves some value's shape unscaled.
bool batch_consistent(const Graph& g, const Graph& fixed) {
  const auto scaled = [&](const Shape& s, const Shape& s0) {
    if (s.size() != s0.size()) return -1;
    int axis = -1;
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (s[d] == s0[d]) continue;
      if (axis >= 0 || s[d] * fixed.batch != s0[d] * g.batch) return -1;
      axis = static_cast<int>(d);
    }
    return axis;
  };
  for (const auto& [value, s0] : fixed.shapes) {
    if (fixed.is_constant(value)) continue;
    const auto it = g.shapes.find(value);
    if (it == g.shapes.end() || g.is_constant(value)) return false;
    const int axis = scaled(it->second, s0);
    if (axis < 0 || (g.is_output(value) && axis != 0)) return false;
  }
  return true;
}

Graph import_graph(const pb::ModelProto& model, const std::string& path,
                   const LoadOptions& options) {
  const std::filesystem::path file(path);
  Graph g;
  g.file = path;
  g.batch = options.batch;
  for (const auto& imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx") g.opset = imp.version();
  if (g.opset < kMinOpset || g.opset > kMaxOpset)
    throw InputError(fmt::format("{}: opset {} is not supported (kdflow reads opsets {} to {})",
                                 path, g.opset, kMinOpset, kMaxOpset));
  const auto dir = file.parent_path();
  const pb::GraphProto& gp = model.graph();
  for (const auto& init : gp.initializer()) {
    if (g.is_constant(init.name()))
      throw InputError(fmt::format("{}: initializer '{}' is defined twice", path, init.name()));
    Tensor t = to_tensor(init, dir, path);
    g.shapes[init.name()] = t.shape;
    g.types[init.name()] = t.type;
    g.constants[init.name()] = std::move(t);
  }
  for (const auto& in : gp.input()) {
    if (g.is_constant(in.name())) continue;
    if (!g.input.empty())
      throw InputError(
          fmt::format("{}: has more than one input ('{}', '{}'); a teacher takes one image batch",
                      path, g.input, in.name()));
    g.input = in.name();
    const auto& tt = in.type().tensor_type();
    if (tt.elem_type() != pb::TensorProto::FLOAT)
      throw InputError(fmt::format("{}: input '{}' must be float32", path, in.name()));
    const auto& dims = tt.shape().dim();
    if (dims.size() < 2)
      throw InputError(
          fmt::format("{}: input '{}' has rank {}; a batch of samples needs at least 2", path,
                      in.name(), dims.size()));
    const auto given = [&](const std::optional<Shape>& shape, int d) -> std::int64_t {
      return shape && static_cast<std::size_t>(d) <= shape->size()
                 ? (*shape)[static_cast<std::size_t>(d - 1)]
                 : 0;
    };
    g.input_shape.push_back(options.batch);
    for (int d = 1; d < dims.size(); ++d) {
      const std::int64_t required = given(options.sample_shape, d);
      if (dims[d].has_dim_value() && dims[d].dim_value() > 0) {
        if (required > 0 && required != dims[d].dim_value())
          throw InputError(fmt::format(
              "{}: input '{}' takes samples of shape {}, {} asks for {}", path, in.name(),
              dims_text(dims), options.sample_source.empty() ? "the data" : options.sample_source,
              wanted_text(*options.sample_shape)));
        g.input_shape.push_back(dims[d].dim_value());
      } else if (const std::int64_t v = required > 0 ? required : given(options.sample_default, d);
                 v > 0) {
        g.input_shape.push_back(v); // a dimension the model leaves open, bound here
      } else {
        throw InputError(
            fmt::format("{}: input '{}' dimension {} is not fixed{}", path, in.name(), d,
                        options.sample_source.empty()
                            ? ""
                            : fmt::format(" (set {} to bind it)", options.sample_source)));
      }
    }
  }
  if (g.input.empty()) throw InputError(fmt::format("{}: the graph has no input", path));
  if (options.sample_shape && g.input_shape.size() != options.sample_shape->size() + 1)
    throw InputError(
        fmt::format("{}: input '{}' takes samples of shape {}, {} asks for {}", path, g.input,
                    format_shape(Shape(g.input_shape.begin() + 1, g.input_shape.end())),
                    options.sample_source.empty() ? "the data" : options.sample_source,
                    wanted_text(*options.sample_shape)));
  if (const std::int64_t n = numel(g.input_shape); n > kMaxTensorElements)
    throw InputError(fmt::format("{}: input '{}' of shape {} has {} elements (at most {} per "
                                 "tensor)",
                                 path, g.input, format_shape(g.input_shape), n,
                                 kMaxTensorElements));
  g.shapes[g.input] = g.input_shape;
  g.types[g.input] = ElemType::f32;
  for (const auto& out : gp.output()) g.outputs.push_back(out.name());

  // Import nodes, inferring shapes and folding every node whose inputs are all constant.
  int unnamed = 0;
  for (const auto& np : Inliner(model, path, g.opset, options.limits).flatten(gp.node())) {
    Node node;
    node.op = np.op_type();
    node.name = np.name().empty() ? fmt::format("{}_{}", np.op_type(), unnamed++) : np.name();
    if (!np.domain().empty() && np.domain() != "ai.onnx")
      throw InputError(
          fmt::format("{}: node '{}' uses op domain '{}' ({}), which kdflow does not support", path,
                      node.name, np.domain(), node.op));
    node.inputs.assign(np.input().begin(), np.input().end());
    node.outputs.assign(np.output().begin(), np.output().end());
    for (const auto& out : node.outputs)
      if (!out.empty() && g.shapes.count(out))
        throw InputError(fmt::format("{}: {} assigns '{}', which is already assigned (a graph "
                                     "assigns each value once)",
                                     path, node.describe(), out));
    for (const auto& a : np.attribute()) node.attrs[a.name()] = to_attribute(a, dir, path);
    // Drop trailing optional outputs nobody reads (Dropout's mask, BatchNorm's training outputs).
    const OpDef* op = find_op(node.op);
    const bool training_outputs = op != nullptr && op->training_outputs;
    while (node.outputs.size() > 1 && (node.outputs.back().empty() || training_outputs))
      node.outputs.pop_back();

    std::vector<Shape> shapes;
    std::vector<ElemType> types;
    std::vector<const Tensor*> constant;
    bool all_constant = true;
    for (const auto& in : node.inputs) {
      if (in.empty()) {
        shapes.emplace_back();
        types.push_back(ElemType::f32);
        constant.push_back(nullptr);
        continue;
      }
      const auto it = g.shapes.find(in);
      if (it == g.shapes.end())
        throw InputError(fmt::format("{}: {} reads '{}', which nothing produces before it", path,
                                     node.describe(), in));
      shapes.push_back(it->second);
      types.push_back(g.types[in]);
      const auto c = g.constants.find(in);
      constant.push_back(c == g.constants.end() ? nullptr : &c->second);
      all_constant = all_constant && c != g.constants.end();
    }
    std::vector<InferredOutput> outs;
    try {
      outs = infer(node, shapes, types, constant, g.opset);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", path, e.what()));
    }
    if (outs.size() != node.outputs.size())
      throw InputError(fmt::format("{}: {} has {} outputs, kdflow expects {}", path,
                                   node.describe(), node.outputs.size(), outs.size()));
    for (std::size_t k = 0; k < outs.size(); ++k) {
      // A declared or inferred shape that no memory could hold is refused here, before a folded
      // constant or the plan's buffers are allocated for it.
      if (const std::int64_t n = numel(outs[k].shape); n > kMaxTensorElements)
        throw InputError(fmt::format("{}: {} output '{}' of shape {} has {} elements (at most {} "
                                     "per tensor)",
                                     path, node.describe(), node.outputs[k],
                                     format_shape(outs[k].shape), n, kMaxTensorElements));
      g.shapes[node.outputs[k]] = outs[k].shape;
      g.types[node.outputs[k]] = outs[k].type;
    }
    // An op that reads shapes only (Shape) always folds: shapes are static here.
    const bool shapes_only = op != nullptr && op->reads_shapes_only;
    if (all_constant || shapes_only) {
      std::vector<const Tensor*> inputs = constant;
      std::vector<Tensor> shape_only(shapes_only ? shapes.size() : 0);
      for (std::size_t k = 0; k < shape_only.size(); ++k) {
        shape_only[k].shape = shapes[k];
        inputs[k] = &shape_only[k];
      }
      auto values = evaluate(node, inputs, outs, g.opset);
      for (std::size_t k = 0; k < values.size(); ++k)
        g.constants[node.outputs[k]] = std::move(values[k]);
      continue;
    }
    for (std::size_t k = 0; k < outs.size(); ++k)
      if (outs[k].type != ElemType::f32)
        throw InputError(fmt::format(
            "{}: {} computes integers from the input data; kdflow runs float tensors only", path,
            node.describe()));
    g.nodes.push_back(std::move(node));
  }
  for (const auto& o : g.outputs)
    if (!g.shapes.count(o))
      throw InputError(fmt::format("{}: graph output '{}' is never produced", path, o));
  g.kept = options.keep;
  if (options.run_passes) run_passes(g);
  return g;
}

} // namespace

Graph load_onnx(const std::string& path, const LoadOptions& options) {
  const pb::ModelProto model = parse(path);
  const std::int64_t fixed = declared_batch(model);
  if (fixed == 0 || fixed == options.batch) return import_graph(model, path, options);
  // The model declares batch `fixed`. Most graphs still run at any batch (the exporter kept the
  // batch symbolic inside); those that do not, run at their own batch, options.batch / fixed
  // times per batch.
  LoadOptions at_fixed = options;
  at_fixed.batch = fixed;
  Graph own = import_graph(model, path, at_fixed);
  std::string why;
  try {
    Graph g = import_graph(model, path, options);
    if (batch_consistent(g, own)) return g;
    why = "its values change shape with the batch";
  } catch (const InputError& e) {
    why = e.what();
  }
  if (options.batch % fixed != 0)
    throw InputError(fmt::format(
        "{}: the model fixes its batch at {} (at batch {}: {}), which does not divide teacher "
        "batch {}; export it with a dynamic batch dimension, or use a multiple of {}",
        path, fixed, options.batch, why, options.batch, fixed));
  for (const auto& out : own.outputs)
    if (own.shape(out).empty() || own.shape(out)[0] != fixed)
      throw InputError(fmt::format("{}: the model fixes its batch at {}, and its output '{}' of "
                                   "shape {} does not lead with it",
                                   path, fixed, out, format_shape(own.shape(out))));
  own.chunks = options.batch / fixed;
  return own;
}

std::optional<Graph> load_onnx_in_passes(const std::string& path, const LoadOptions& options,
                                         const Graph& whole, std::int64_t per_pass) {
  if (whole.chunks != 1 || whole.batch != options.batch || per_pass < 1 ||
      per_pass >= options.batch || options.batch % per_pass != 0)
    return std::nullopt;
  LoadOptions at = options;
  at.batch = per_pass;
  std::optional<Graph> g;
  try {
    g = load_onnx(path, at);
  } catch (const InputError&) {
    return std::nullopt; // the graph does not import at that batch (a batch it hard-codes)
  }
  if (g->chunks != 1 || !batch_consistent(whole, *g)) return std::nullopt;
  g->chunks = options.batch / per_pass;
  return g;
}

} // namespace kdflow::teacher
