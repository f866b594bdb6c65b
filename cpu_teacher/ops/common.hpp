// Helpers the op families' shape rules and reference loops share (internal); defined in
// reference.cpp beside the dispatch through the op table.
#pragma once

#include "op_table.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kdflow::teacher {

// An InputError naming the node.
[[noreturn]] void bad(const Node& node, const std::string& what);

// `axis` in [-rank, rank) made non-negative; an InputError outside.
std::int64_t norm_axis(const Node& node, std::int64_t axis, std::int64_t rank);

Shape strides_of(const Shape& s);
// Numpy broadcasting of two shapes; an InputError when they do not broadcast.
Shape broadcast(const Node& node, const Shape& a, const Shape& b);
// Strides of `in` seen from an output of shape `out` under numpy broadcasting (0 on broadcast
// dims).
Shape broadcast_strides(const Shape& in, const Shape& out);

// Calls f(flat index, multi-index) for every element of `shape`, in row-major order.
template <typename F>
void for_each_index(const Shape& shape, F&& f) {
  const std::int64_t n = numel(shape);
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    f(k, idx);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Pooling / convolution output extent along one axis.
std::int64_t out_extent(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil,
                        std::int64_t pb, std::int64_t pe, bool ceil_mode);
// Turns auto_pad into explicit pads and fills defaults for a 2-D window op.
void normalize_window(Node& node, const Shape& x, const Shape& kernel);

// Input k's data, which must be a constant (kdflow runs at a fixed shape); `what` names it.
const Tensor& need_constant(const Node& node, const std::vector<const Tensor*>& c, std::size_t k,
                            const char* what);
bool has_input(const Node& node, std::size_t k);

// The shape rule of ops whose output is their input's shape and type.
std::vector<InferredOutput> same_shape(Node& node, const InferArgs& args);

} // namespace kdflow::teacher
