// Graph helpers: tensors, attributes, shapes, consumers.
#include "kdflow/cpu_teacher/graph.hpp"

#include <algorithm>

#include "kdflow/core/error.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace kdflow::teacher {

std::int64_t numel(const Shape& shape) {
  // Shapes come from model files: a product past 64 bits is an input error, never a wrapped
  // count that sizes a buffer.
  std::int64_t n = 1;
  for (const auto d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      throw InputError(
          fmt::format("shape {} has more elements than can be addressed", format_shape(shape)));
  return n;
}

std::string format_shape(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Tensor Tensor::floats(Shape shape, std::vector<float> data) {
  Tensor t;
  t.type = ElemType::f32;
  t.shape = std::move(shape);
  t.f = std::move(data);
  return t;
}

Tensor Tensor::ints(Shape shape, std::vector<std::int64_t> data) {
  Tensor t;
  t.type = ElemType::i64;
  t.shape = std::move(shape);
  t.i = std::move(data);
  return t;
}

double Tensor::at(std::int64_t k) const {
  return type == ElemType::f32 ? f[static_cast<std::size_t>(k)]
                               : static_cast<double>(i[static_cast<std::size_t>(k)]);
}

std::int64_t Tensor::int_at(std::int64_t k) const {
  return type == ElemType::i64 ? i[static_cast<std::size_t>(k)]
                               : static_cast<std::int64_t>(f[static_cast<std::size_t>(k)]);
}

std::vector<std::int64_t> Tensor::as_ints() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(size()));
  for (std::int64_t k = 0; k < size(); ++k) out[static_cast<std::size_t>(k)] = int_at(k);
  return out;
}

std::int64_t Node::int_attr(const std::string& attr, std::int64_t fallback) const {
  const auto it = attrs.find(attr);
  return it == attrs.end() ? fallback : it->second.i;
}

float Node::float_attr(const std::string& attr, float fallback) const {
  const auto it = attrs.find(attr);
  return it == attrs.end() ? fallback : it->second.f;
}

std::string Node::string_attr(const std::string& attr, const std::string& fallback) const {
  const auto it = attrs.find(attr);
  return it == attrs.end() ? fallback : it->second.s;
}

std::vector<std::int64_t> Node::ints_attr(const std::string& attr,
                                          std::vector<std::int64_t> fallback) const {
  const auto it = attrs.find(attr);
  return it == attrs.end() ? fallback : it->second.ints;
}

std::string Node::describe() const { return fmt::format("{} node '{}'", op, name); }

const Shape& Graph::shape(const std::string& value) const {
  const auto it = shapes.find(value);
  if (it == shapes.end())
    throw std::logic_error("teacher graph: no shape for value '" + value + "'");
  return it->second;
}

int Graph::producer(const std::string& value) const {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs)
      if (o == value) return static_cast<int>(i);
  return -1;
}

std::vector<std::size_t> Graph::consumers(const std::string& value) const {
  std::vector<std::size_t> out;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const auto& node = nodes[n];
    const bool reads =
        std::find(node.inputs.begin(), node.inputs.end(), value) != node.inputs.end() ||
        std::any_of(node.post_ops.begin(), node.post_ops.end(),
                    [&](const PostOp& p) { return p.sum_input == value; });
    if (reads) out.push_back(n);
  }
  return out;
}

bool Graph::is_output(const std::string& value) const {
  return std::find(outputs.begin(), outputs.end(), value) != outputs.end() ||
         std::find(kept.begin(), kept.end(), value) != kept.end();
}

} // namespace kdflow::teacher
