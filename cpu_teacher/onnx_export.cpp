// A Graph written as an ONNX model (graph.hpp's write_onnx): the reverse of onnx_import.cpp, with
// the same compiled onnx.proto. The batch dimension of the input and outputs is left open.
#include "kdflow/cpu_teacher/graph.hpp"

#include "kdflow/core/atomic_file.hpp"

#include <kdflow_onnx.pb.h>

#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

namespace pb = kdflow_onnx;

void set_tensor(pb::TensorProto& out, const std::string& name, const Tensor& t) {
  out.set_name(name);
  for (const auto d : t.shape) out.add_dims(d);
  if (t.type == ElemType::f32) {
    out.set_data_type(pb::TensorProto::FLOAT);
    out.set_raw_data(std::string(reinterpret_cast<const char*>(t.f.data()), t.f.size() * 4));
  } else {
    out.set_data_type(pb::TensorProto::INT64);
    out.set_raw_data(std::string(reinterpret_cast<const char*>(t.i.data()), t.i.size() * 8));
  }
}

void set_attribute(pb::AttributeProto& out, const std::string& name, const Attribute& a) {
  out.set_name(name);
  switch (a.kind) {
  case Attribute::Kind::i:
    out.set_type(pb::AttributeProto::INT);
    out.set_i(a.i);
    break;
  case Attribute::Kind::f:
    out.set_type(pb::AttributeProto::FLOAT);
    out.set_f(a.f);
    break;
  case Attribute::Kind::s:
    out.set_type(pb::AttributeProto::STRING);
    out.set_s(a.s);
    break;
  case Attribute::Kind::ints:
    out.set_type(pb::AttributeProto::INTS);
    for (const auto v : a.ints) out.add_ints(v);
    break;
  case Attribute::Kind::floats:
    out.set_type(pb::AttributeProto::FLOATS);
    for (const auto v : a.floats) out.add_floats(v);
    break;
  case Attribute::Kind::tensor:
    out.set_type(pb::AttributeProto::TENSOR);
    set_tensor(*out.mutable_t(), name, *a.t);
    break;
  case Attribute::Kind::none: throw std::logic_error("write_onnx: attribute '" + name + "' unset");
  }
}

// A float32 value whose first dimension is the open batch.
void set_batched(pb::ValueInfoProto& out, const std::string& name, const Shape& shape) {
  out.set_name(name);
  auto& tensor = *out.mutable_type()->mutable_tensor_type();
  tensor.set_elem_type(pb::TensorProto::FLOAT);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    auto& dim = *tensor.mutable_shape()->add_dim();
    if (d == 0)
      dim.set_dim_param("batch");
    else
      dim.set_dim_value(shape[d]);
  }
}

} // namespace

void write_onnx(const Graph& g, const std::string& path, const std::string& producer) {
  pb::ModelProto model;
  model.set_ir_version(8); // what opset 17 comes with
  model.set_producer_name(producer);
  auto& opset = *model.add_opset_import();
  opset.set_domain("");
  opset.set_version(g.opset);
  pb::GraphProto& graph = *model.mutable_graph();
  graph.set_name("kdflow_student");
  set_batched(*graph.add_input(), g.input, g.input_shape);
  for (const auto& out : g.outputs) set_batched(*graph.add_output(), out, g.shape(out));
  for (const auto& [name, t] : g.constants) set_tensor(*graph.add_initializer(), name, t);
  for (const Node& n : g.nodes) {
    if (!n.post_ops.empty())
      throw std::logic_error("write_onnx: node '" + n.name + "' has fused post-ops");
    pb::NodeProto& node = *graph.add_node();
    node.set_op_type(n.op);
    node.set_name(n.name);
    for (const auto& in : n.inputs) node.add_input(in);
    for (const auto& out : n.outputs) node.add_output(out);
    for (const auto& [name, a] : n.attrs) set_attribute(*node.add_attribute(), name, a);
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    throw std::runtime_error(fmt::format("{}: the ONNX model could not be serialized", path));
  write_file_atomic(path, bytes);
}

} // namespace kdflow::teacher
