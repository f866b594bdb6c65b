// ONNX import: protobuf model -> kdflow Graph with static shapes, constants folded, passes applied.
// Only this file sees protobuf and the ONNX checker.
#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow/cpu_teacher/passes.hpp"
#include "kdflow/cpu_teacher/reference.hpp"

#include "kdflow/core/error.hpp"
#include "ops/op_table.hpp"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

constexpr std::int64_t kMinOpset = 11;
// 17: the newest opset Debian's ONNX checker (1.12) validates.
constexpr std::int64_t kMaxOpset = 17;

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string read_bytes(const std::filesystem::path& path, std::int64_t offset = 0,
                       std::int64_t length = -1) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot read the file", path.string()));
  in.seekg(0, std::ios::end);
  const std::int64_t size = in.tellg();
  if (length < 0) length = size - offset;
  if (offset < 0 || offset + length > size)
    throw InputError(fmt::format("{}: truncated (wants bytes {}..{} of {})", path.string(), offset,
                                 offset + length, size));
  std::string bytes(static_cast<std::size_t>(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  return bytes;
}

Tensor to_tensor(const onnx::TensorProto& t, const std::filesystem::path& model_dir,
                 const std::string& file) {
  Shape shape(t.dims().begin(), t.dims().end());
  const auto n = static_cast<std::size_t>(numel(shape));
  std::string raw;
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    std::int64_t offset = 0, length = -1;
    for (const auto& kv : t.external_data()) {
      if (kv.key() == "location")
        location = kv.value();
      else if (kv.key() == "offset")
        offset = std::stoll(kv.value());
      else if (kv.key() == "length")
        length = std::stoll(kv.value());
    }
    raw = read_bytes(model_dir / location, offset, length);
  } else if (t.has_raw_data()) {
    raw = t.raw_data();
  }
  const auto type = t.data_type();
  const auto want = [&](std::size_t elem) {
    if (!raw.empty() && raw.size() != n * elem)
      throw InputError(fmt::format("{}: initializer '{}' holds {} bytes, its shape {} needs {}",
                                   file, t.name(), raw.size(), format_shape(shape), n * elem));
  };
  if (type == onnx::TensorProto::FLOAT) {
    std::vector<float> v(n);
    if (!raw.empty()) {
      want(4);
      std::memcpy(v.data(), raw.data(), raw.size());
    } else {
      if (static_cast<std::size_t>(t.float_data_size()) != n)
        throw InputError(fmt::format("{}: initializer '{}' has {} values for shape {}", file,
                                     t.name(), t.float_data_size(), format_shape(shape)));
      std::copy(t.float_data().begin(), t.float_data().end(), v.begin());
    }
    return Tensor::floats(shape, std::move(v));
  }
  if (type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32 ||
      type == onnx::TensorProto::BOOL) {
    std::vector<std::int64_t> v(n);
    if (!raw.empty()) {
      const std::size_t elem = type == onnx::TensorProto::INT64   ? 8
                               : type == onnx::TensorProto::INT32 ? 4
                                                                  : 1;
      want(elem);
      for (std::size_t k = 0; k < n; ++k) {
        if (elem == 8)
          std::memcpy(&v[k], raw.data() + 8 * k, 8);
        else if (elem == 4) {
          std::int32_t x;
          std::memcpy(&x, raw.data() + 4 * k, 4);
          v[k] = x;
        } else {
          v[k] = raw[k] != 0;
        }
      }
    } else if (type == onnx::TensorProto::INT64) {
      std::copy(t.int64_data().begin(), t.int64_data().end(), v.begin());
    } else {
      std::copy(t.int32_data().begin(), t.int32_data().end(), v.begin());
    }
    return Tensor::ints(shape, std::move(v));
  }
  if (type == onnx::TensorProto::DOUBLE) {
    std::vector<float> v(n);
    if (!raw.empty()) {
      want(8);
      for (std::size_t k = 0; k < n; ++k) {
        double d;
        std::memcpy(&d, raw.data() + 8 * k, 8);
        v[k] = static_cast<float>(d);
      }
    } else {
      std::copy(t.double_data().begin(), t.double_data().end(), v.begin());
    }
    return Tensor::floats(shape, std::move(v));
  }
  throw InputError(fmt::format("{}: tensor '{}' has element type {}, which kdflow does not read",
                               file, t.name(), static_cast<int>(type)));
}

Attribute to_attribute(const onnx::AttributeProto& a, const std::filesystem::path& dir,
                       const std::string& file) {
  Attribute r;
  switch (a.type()) {
  case onnx::AttributeProto::INT:
    r.kind = Attribute::Kind::i;
    r.i = a.i();
    break;
  case onnx::AttributeProto::FLOAT:
    r.kind = Attribute::Kind::f;
    r.f = a.f();
    break;
  case onnx::AttributeProto::STRING:
    r.kind = Attribute::Kind::s;
    r.s = a.s();
    break;
  case onnx::AttributeProto::INTS:
    r.kind = Attribute::Kind::ints;
    r.ints.assign(a.ints().begin(), a.ints().end());
    break;
  case onnx::AttributeProto::FLOATS:
    r.kind = Attribute::Kind::floats;
    r.floats.assign(a.floats().begin(), a.floats().end());
    break;
  case onnx::AttributeProto::TENSOR:
    r.kind = Attribute::Kind::tensor;
    r.t = to_tensor(a.t(), dir, file);
    break;
  default:
    r.kind = Attribute::Kind::none;
    break; // graphs, sparse tensors: not used by supported ops
  }
  return r;
}

} // namespace

Graph load_onnx(const std::string& path, const LoadOptions& options) {
  const std::filesystem::path file(path);
  if (!std::filesystem::exists(file))
    throw InputError(fmt::format("{}: no such teacher model file", path));
  const std::string bytes = read_bytes(file);
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes))
    throw InputError(
        fmt::format("{}: not a valid ONNX model (truncated or corrupt protobuf)", path));
  try {
    onnx::checker::check_model(path);
  } catch (const std::exception& e) {
    throw InputError(
        fmt::format("{}: the ONNX checker rejects it: {}", path, first_line(e.what())));
  }

  Graph g;
  g.file = path;
  g.batch = options.batch;
  for (const auto& imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx") g.opset = imp.version();
  if (g.opset < kMinOpset || g.opset > kMaxOpset)
    throw InputError(fmt::format("{}: opset {} is not supported (kdflow reads opsets {} to {})",
                                 path, g.opset, kMinOpset, kMaxOpset));
  const auto dir = file.parent_path();
  const onnx::GraphProto& gp = model.graph();
  for (const auto& init : gp.initializer()) {
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
    if (tt.elem_type() != onnx::TensorProto::FLOAT)
      throw InputError(fmt::format("{}: input '{}' must be float32", path, in.name()));
    const auto& dims = tt.shape().dim();
    for (int d = 0; d < dims.size(); ++d) {
      if (d == 0)
        g.input_shape.push_back(options.batch);
      else if (dims[d].has_dim_value() && dims[d].dim_value() > 0)
        g.input_shape.push_back(dims[d].dim_value());
      else
        throw InputError(
            fmt::format("{}: input '{}' dimension {} is not fixed", path, in.name(), d));
    }
    if (g.input_shape.size() < 2)
      throw InputError(
          fmt::format("{}: input '{}' has rank {}; a batch of samples needs at least 2", path,
                      in.name(), dims.size()));
  }
  if (g.input.empty()) throw InputError(fmt::format("{}: the graph has no input", path));
  if (options.sample_shape &&
      Shape(g.input_shape.begin() + 1, g.input_shape.end()) != *options.sample_shape)
    throw InputError(
        fmt::format("{}: input '{}' takes samples of shape {}, the data has {}", path, g.input,
                    format_shape(Shape(g.input_shape.begin() + 1, g.input_shape.end())),
                    format_shape(*options.sample_shape)));
  g.shapes[g.input] = g.input_shape;
  g.types[g.input] = ElemType::f32;
  for (const auto& out : gp.output()) g.outputs.push_back(out.name());

  // Import nodes, inferring shapes and folding every node whose inputs are all constant.
  int unnamed = 0;
  for (const auto& np : gp.node()) {
    Node node;
    node.op = np.op_type();
    node.name = np.name().empty() ? fmt::format("{}_{}", np.op_type(), unnamed++) : np.name();
    if (!np.domain().empty() && np.domain() != "ai.onnx")
      throw InputError(
          fmt::format("{}: node '{}' uses op domain '{}' ({}), which kdflow does not support", path,
                      node.name, np.domain(), node.op));
    node.inputs.assign(np.input().begin(), np.input().end());
    node.outputs.assign(np.output().begin(), np.output().end());
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
  if (options.run_passes) run_passes(g);
  return g;
}

} // namespace kdflow::teacher
