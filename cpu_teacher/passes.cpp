// Graph passes: each rewrites the node list in place and preserves the values every remaining node
// and graph output reads.
#include "kdflow/cpu_teacher/passes.hpp"

#include "kdflow/cpu_teacher/ops.hpp"
#include "ops/common.hpp"
#include "ops/op_table.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

bool is_activation(const Node& n) {
  const OpDef* op = find_op(n.op);
  return op != nullptr && op->activation != nullptr;
}

// The post-ops the oneDNN primitive that runs `n` can absorb (its op table entry says).
PostOps post_ops_of(const Graph& g, const Node& n) {
  const OpDef* op = find_op(n.op);
  return op != nullptr && op->post_ops != nullptr ? op->post_ops(g, n) : PostOps::none;
}

void rename_uses(Graph& g, const std::string& from, const std::string& to) {
  for (auto& n : g.nodes) {
    for (auto& in : n.inputs)
      if (in == from) in = to;
    for (auto& p : n.post_ops)
      if (p.sum_input == from) p.sum_input = to;
  }
}

// Node `target` takes over node `fused` as a post-op: it now writes fused's output, and fused goes.
void absorb(Graph& g, std::size_t target, PostOp post, std::size_t fused) {
  g.nodes[target].post_ops.push_back(std::move(post));
  g.nodes[target].outputs[0] = g.nodes[fused].outputs[0];
  g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(fused));
}

// Views that keep their input's shape (Identity, Dropout, a Flatten or Reshape that changes
// nothing): readers use the input directly.
bool remove_noops(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const OpDef* op = find_op(n.op);
    const bool noop = op != nullptr && op->view && g.shape(n.inputs[0]) == g.shape(n.outputs[0]);
    if (!noop || g.is_output(n.outputs[0]) || g.is_constant(n.inputs[0])) continue;
    const std::string in = n.inputs[0], out = n.outputs[0];
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    rename_uses(g, out, in);
    return true;
  }
  return false;
}

bool fold_batchnorm(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node& bn = g.nodes[i];
    if (bn.op != "BatchNormalization") continue;
    bool constant_params = true;
    for (std::size_t k = 1; k < 5; ++k)
      constant_params = constant_params && g.is_constant(bn.inputs[k]);
    if (!constant_params) continue; // the engine names it as unsupported
    const auto& scale = g.constants.at(bn.inputs[1]).f;
    const auto& shift = g.constants.at(bn.inputs[2]).f;
    const auto& mean = g.constants.at(bn.inputs[3]).f;
    const auto& var = g.constants.at(bn.inputs[4]).f;
    const float eps = bn.float_attr("epsilon", 1e-5f);
    const std::size_t channels = scale.size();
    std::vector<float> a(channels), b(channels);
    for (std::size_t c = 0; c < channels; ++c) {
      a[c] = scale[c] / std::sqrt(var[c] + eps);
      b[c] = shift[c] - mean[c] * a[c];
    }
    const int p = g.producer(bn.inputs[0]);
    const bool foldable = p >= 0 && g.nodes[p].op == "Conv" && g.nodes[p].post_ops.empty() &&
                          g.consumers(bn.inputs[0]).size() == 1 && !g.is_output(bn.inputs[0]) &&
                          g.is_constant(g.nodes[p].inputs[1]);
    if (foldable) {
      Node& conv = g.nodes[static_cast<std::size_t>(p)];
      Tensor w = g.constants.at(conv.inputs[1]);
      const std::int64_t per_oc = w.size() / w.shape[0];
      for (std::int64_t oc = 0; oc < w.shape[0]; ++oc)
        for (std::int64_t k = 0; k < per_oc; ++k)
          w.f[static_cast<std::size_t>(oc * per_oc + k)] *= a[static_cast<std::size_t>(oc)];
      std::vector<float> bias(channels, 0.f);
      if (conv.inputs.size() > 2 && !conv.inputs[2].empty())
        bias = g.constants.at(conv.inputs[2]).f;
      for (std::size_t c = 0; c < channels; ++c) bias[c] = bias[c] * a[c] + b[c];
      const std::string wname = conv.name + ".folded_weight", bname = conv.name + ".folded_bias";
      g.constants[wname] = std::move(w);
      g.constants[bname] = Tensor::floats({static_cast<std::int64_t>(channels)}, bias);
      g.shapes[wname] = g.constants[wname].shape;
      g.shapes[bname] = {static_cast<std::int64_t>(channels)};
      conv.inputs.resize(3);
      conv.inputs[1] = wname;
      conv.inputs[2] = bname;
      conv.outputs[0] = bn.outputs[0];
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
    // Alone: a depthwise 1x1 convolution computes x * a + b per channel in one primitive.
    if (g.shape(bn.inputs[0]).size() != 4) continue;
    const std::string wname = bn.name + ".as_conv_weight", bname = bn.name + ".as_conv_bias";
    const auto ch = static_cast<std::int64_t>(channels);
    g.constants[wname] = Tensor::floats({ch, 1, 1, 1}, a);
    g.constants[bname] = Tensor::floats({ch}, b);
    g.shapes[wname] = {ch, 1, 1, 1};
    g.shapes[bname] = {ch};
    Node conv;
    conv.op = "Conv";
    conv.name = bn.name;
    conv.inputs = {bn.inputs[0], wname, bname};
    conv.outputs = {bn.outputs[0]};
    const auto ints = [](std::vector<std::int64_t> v) {
      Attribute at;
      at.kind = Attribute::Kind::ints;
      at.ints = std::move(v);
      return at;
    };
    conv.attrs["kernel_shape"] = ints({1, 1});
    conv.attrs["strides"] = ints({1, 1});
    conv.attrs["dilations"] = ints({1, 1});
    conv.attrs["pads"] = ints({0, 0, 0, 0});
    Attribute group;
    group.kind = Attribute::Kind::i;
    group.i = ch;
    conv.attrs["group"] = group;
    g.nodes[i] = std::move(conv);
    return true;
  }
  return false;
}

// A 2-D convolution with constant weights, as the shape passes read it.
struct ConvGeometry {
  Shape x, out;
  const Tensor* w;
  std::vector<std::int64_t> strides, dilations, pads;
};
std::optional<ConvGeometry> conv_geometry(const Graph& g, const Node& conv) {
  if (conv.op != "Conv" || !g.is_constant(conv.inputs[1])) return std::nullopt;
  const Tensor& w = g.constants.at(conv.inputs[1]);
  ConvGeometry c{g.shape(conv.inputs[0]),   g.shape(conv.outputs[0]),    &w,
                 conv.ints_attr("strides"), conv.ints_attr("dilations"), conv.ints_attr("pads")};
  if (c.x.size() != 4 || w.shape.size() != 4) return std::nullopt;
  return c;
}

// The kernel taps a convolution keeps along one spatial axis: those some output position reads
// inside the input (the rest multiply padding). nullopt when nothing can be cut exactly.
struct AxisTrim {
  std::int64_t first = 0, taps = 0, pad_begin = 0, pad_end = 0;
};
std::optional<AxisTrim> trim_axis(std::int64_t in, std::int64_t out, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t dilation,
                                  std::int64_t pad_begin, std::int64_t pad_end) {
  const auto used = [&](std::int64_t k) {
    for (std::int64_t o = 0; o < out; ++o) {
      const std::int64_t i = o * stride - pad_begin + k * dilation;
      if (i >= 0 && i < in) return true;
    }
    return false;
  };
  std::int64_t first = 0, last = kernel - 1;
  while (first < kernel && !used(first)) ++first;
  while (last > first && !used(last)) --last;
  if (first == kernel || (first == 0 && last == kernel - 1)) return std::nullopt;
  AxisTrim t{first, last - first + 1, pad_begin - first * dilation, 0};
  if (t.pad_begin < 0) return std::nullopt;
  // The least end padding that keeps the output size.
  t.pad_end = std::max<std::int64_t>(0, (out - 1) * stride + dilation * (t.taps - 1) + 1 - in -
                                            t.pad_begin);
  if ((in + t.pad_begin + t.pad_end - dilation * (t.taps - 1) - 1) / stride + 1 != out ||
      t.pad_end > pad_end)
    return std::nullopt;
  return t;
}

// A convolution on a map smaller than its kernel's reach (3x3 with padding 1 on the 1x1 maps at
// the end of a ResNet on 32x32 inputs) has taps that only ever read padding. They are cut off the
// kernel's edges and the padding shrunk to match: the same values, without the zero products
// (which AMX's kernels compute at full cost: 6.6 ms instead of 0.1 for such a layer at batch 64).
bool trim_padding_taps(Graph& g) {
  for (auto& conv : g.nodes) {
    const auto geo = conv_geometry(g, conv);
    if (!geo) continue;
    const Shape &xs = geo->x, &os = geo->out;
    const Tensor& w = *geo->w;
    const auto &s = geo->strides, &d = geo->dilations, &pads = geo->pads;
    std::optional<AxisTrim> axes[2];
    for (std::size_t a = 0; a < 2; ++a)
      axes[a] = trim_axis(xs[2 + a], os[2 + a], w.shape[2 + a], s[a], d[a], pads[a], pads[2 + a]);
    if (!axes[0] && !axes[1]) continue;
    AxisTrim h = axes[0].value_or(AxisTrim{0, w.shape[2], pads[0], pads[2]});
    AxisTrim v = axes[1].value_or(AxisTrim{0, w.shape[3], pads[1], pads[3]});
    const Shape ts = {w.shape[0], w.shape[1], h.taps, v.taps};
    std::vector<float> cut(static_cast<std::size_t>(numel(ts)));
    std::size_t k = 0;
    for (std::int64_t o = 0; o < ts[0] * ts[1]; ++o)
      for (std::int64_t y = 0; y < h.taps; ++y)
        for (std::int64_t x = 0; x < v.taps; ++x)
          cut[k++] = w.f[static_cast<std::size_t>((o * w.shape[2] + h.first + y) * w.shape[3] +
                                                  v.first + x)];
    const std::string name = conv.name + ".trimmed_weight";
    g.constants[name] = Tensor::floats(ts, std::move(cut));
    g.shapes[name] = ts;
    conv.inputs[1] = name;
    conv.attrs["pads"].ints = {h.pad_begin, v.pad_begin, h.pad_end, v.pad_end};
    if (conv.has("kernel_shape")) conv.attrs["kernel_shape"].ints = {h.taps, v.taps};
    return true;
  }
  return false;
}

// SiLU as the exporters write it, Mul(x, Sigmoid(x)) with the Sigmoid read by the Mul alone,
// becomes one Swish activation (which fuse_activation can then fold into the node before it).
bool fuse_silu(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& mul = g.nodes[i];
    if (mul.op != "Mul" || mul.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& x = mul.inputs[static_cast<std::size_t>(side)];
      const std::string& gate = mul.inputs[static_cast<std::size_t>(1 - side)];
      const int s = g.producer(gate);
      if (s < 0 || g.nodes[static_cast<std::size_t>(s)].op != "Sigmoid" ||
          g.nodes[static_cast<std::size_t>(s)].inputs[0] != x || g.consumers(gate).size() != 1 ||
          g.is_output(gate))
        continue;
      Node swish;
      swish.op = "Swish";
      swish.name = mul.name;
      swish.inputs = {x};
      swish.outputs = mul.outputs;
      swish.attrs["alpha"] = float_attribute(1.f);
      g.nodes[i] = std::move(swish);
      g.nodes.erase(g.nodes.begin() + s);
      return true;
    }
  }
  return false;
}

// Whether `value` is a one-element constant within 1e-6 (relative) of `want`.
bool is_scalar(const Graph& g, const std::string& value, double want) {
  if (!g.is_constant(value) || g.constants.at(value).size() != 1) return false;
  return std::abs(g.constants.at(value).at(0) - want) <= 1e-6 * std::abs(want);
}

// The node that alone reads `value` (a graph output has a reader outside), or -1.
int sole_reader(const Graph& g, const std::string& value) {
  const auto readers = g.consumers(value);
  if (readers.size() != 1 || g.is_output(value)) return -1;
  return static_cast<int>(readers.front());
}

// The operand of binary node `n` other than `value`, or "" when `value` is not one of them.
std::string other_operand(const Node& n, const std::string& value) {
  if (n.inputs.size() != 2) return {};
  if (n.inputs[0] == value) return n.inputs[1];
  if (n.inputs[1] == value) return n.inputs[0];
  return {};
}

// The channels a Concat over axis 1 of 4-D values joins, each input's; nullopt for any other
// Concat, or one with a constant input or an output that leaves the graph.
std::optional<std::vector<std::int64_t>> channel_concat(const Graph& g, const Node& cat) {
  if (cat.op != "Concat" || cat.inputs.size() < 2 || g.is_output(cat.outputs[0])) return {};
  const Shape& os = g.shape(cat.outputs[0]);
  const std::int64_t axis = cat.int_attr("axis", 0);
  if (os.size() != 4 || (axis != 1 && axis != -3)) return {};
  std::vector<std::int64_t> channels;
  for (const auto& in : cat.inputs) {
    if (in.empty() || g.is_constant(in) || g.shape(in).size() != 4) return {};
    channels.push_back(g.shape(in)[1]);
  }
  return channels;
}

// A MaxPool or AveragePool that alone reads a Concat over channels pools each channel on its own:
// it moves before the Concat, one pool per input, and the Concat joins the pooled maps (the same
// values, bit for bit). The pools do the same work; the Concat copies a pooled map, a quarter of
// the bytes after a 2x2 stride, and may then go entirely (split_conv_over_concat: SqueezeNet's
// fire modules before a pool).
bool pool_before_concat(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto channels = channel_concat(g, g.nodes[i]);
    const int r = channels ? sole_reader(g, g.nodes[i].outputs[0]) : -1;
    if (r < 0) continue;
    const Node cat = g.nodes[i], pool = g.nodes[static_cast<std::size_t>(r)]; // copies: moved below
    if ((pool.op != "MaxPool" && pool.op != "AveragePool") || pool.outputs.size() != 1 ||
        pool.inputs.size() != 1 || pool.inputs[0] != cat.outputs[0] || !pool.post_ops.empty())
      continue;
    const Shape pooled = g.shape(pool.outputs[0]);
    Node joined = cat;
    joined.name = cat.name + ".after_pool";
    joined.outputs = {pool.outputs[0]};
    std::vector<Node> nodes;
    for (std::size_t k = 0; k < cat.inputs.size(); ++k) {
      Node part = pool;
      part.name = fmt::format("{}.part{}", pool.name, k);
      part.inputs = {cat.inputs[k]};
      part.outputs = {fmt::format("{}.part{}", pool.outputs[0], k)};
      g.shapes[part.outputs[0]] = {pooled[0], (*channels)[k], pooled[2], pooled[3]};
      g.types[part.outputs[0]] = ElemType::f32;
      joined.inputs[k] = part.outputs[0];
      nodes.push_back(std::move(part));
    }
    nodes.push_back(std::move(joined));
    // the pool runs after every input is written (it read the Concat), so the parts go at its place
    g.nodes.erase(g.nodes.begin() + r);
    g.nodes.insert(g.nodes.begin() + r, nodes.begin(), nodes.end());
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }
  return false;
}

// A Concat over channels that only convolutions read (groups of 1, constant weights, the Concat as
// their input) is never written: a convolution is linear in its input channels, so each reader
// becomes one convolution per Concat input, over that input's slice of the weights, each after the
// first summing into the one before (an Add, which fuse_residual makes the convolution's sum
// post-op), the bias with the first, the first marked `partial_sum` (it writes f32, under bf16
// and int8 alike, so that the sum is rounded only where the one convolution rounded its output:
// the parts after it sum into f32 and write f32, a product reading it rounds as it reads). The
// readers' work is the same; what goes is the Concat's copy, a read and a write of every joined
// channel. What comes is one more read of a reader's output per extra input (the sum), so it is
// done only where that is at most the Concat's size: a reader with fewer output channels than the
// Concat joins (SqueezeNet's squeeze convolutions, a classifier's 1x1), not an expansion. Each
// input keeps at least 16 channels (a whole vector of f32 and a whole channel block of oneDNN's
// blocked layouts), so that no part's product runs on a sliver of the reduction. Values here are
// f32: the import refuses an integer input to a convolution or a pool.
bool split_conv_over_concat(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto channels = channel_concat(g, g.nodes[i]);
    if (!channels) continue;
    const Node cat = g.nodes[i]; // a copy: the readers' rewrite below moves the nodes
    const std::string joined = cat.outputs[0];
    const auto readers = g.consumers(joined);
    if (readers.empty() ||
        std::any_of(channels->begin(), channels->end(), [](auto c) { return c < 16; }))
      continue;
    const std::int64_t parts = static_cast<std::int64_t>(channels->size());
    std::int64_t extra = 0; // elements the sums read
    bool all_convs = true;
    for (const auto r : readers) {
      const Node& conv = g.nodes[r];
      const bool ok =
          conv.op == "Conv" && conv.inputs[0] == joined && conv.int_attr("group", 1) == 1 &&
          conv.post_ops.empty() && g.is_constant(conv.inputs[1]) &&
          std::count(conv.inputs.begin(), conv.inputs.end(), joined) == 1 &&
          (conv.inputs.size() < 3 || conv.inputs[2].empty() || g.is_constant(conv.inputs[2])) &&
          g.shape(conv.inputs[1]).size() == 4 &&
          g.constants.at(conv.inputs[1]).f.size() ==
              static_cast<std::size_t>(numel(g.shape(conv.inputs[1])));
      if (!ok) {
        all_convs = false;
        break;
      }
      extra += (parts - 1) * numel(g.shape(conv.outputs[0]));
    }
    if (!all_convs || extra > numel(g.shape(joined))) continue;
    for (auto at = readers.rbegin(); at != readers.rend(); ++at) { // later readers first
      const Node conv = g.nodes[*at];
      const Tensor& w = g.constants.at(conv.inputs[1]);
      const std::int64_t out_ch = w.shape[0], in_ch = w.shape[1], taps = w.shape[2] * w.shape[3];
      const Shape out_shape = g.shape(conv.outputs[0]);
      std::vector<Node> nodes;
      std::string sum;
      std::int64_t first = 0;
      for (std::int64_t k = 0; k < parts; ++k) {
        const std::int64_t width = (*channels)[static_cast<std::size_t>(k)];
        std::vector<float> values(static_cast<std::size_t>(out_ch * width * taps));
        for (std::int64_t o = 0; o < out_ch; ++o)
          std::copy_n(w.f.begin() + (o * in_ch + first) * taps, width * taps,
                      values.begin() + o * width * taps);
        first += width;
        // named by the reader's output, which the graph assigns once (node names may repeat)
        const std::string wname = fmt::format("{}.weight_part{}", conv.outputs[0], k);
        g.constants[wname] = Tensor::floats({out_ch, width, w.shape[2], w.shape[3]}, values);
        g.shapes[wname] = {out_ch, width, w.shape[2], w.shape[3]};
        g.types[wname] = ElemType::f32;
        Node part = conv;
        part.attrs.erase("partial_sum"); // a part of a part: its own role, set below
        part.name = fmt::format("{}.part{}", conv.name, k);
        part.inputs = {cat.inputs[static_cast<std::size_t>(k)], wname};
        if (k == 0 && conv.inputs.size() > 2 && !conv.inputs[2].empty())
          part.inputs.push_back(conv.inputs[2]);
        part.outputs = {fmt::format("{}.part{}", conv.outputs[0], k)};
        g.shapes[part.outputs[0]] = out_shape;
        g.types[part.outputs[0]] = ElemType::f32;
        nodes.push_back(part);
        if (k == 0) {
          // the accumulator the other parts sum into: kept in f32 under bf16, as the one
          // convolution's own accumulation was (find_wide_values), rounded once at the end
          if (parts > 1) nodes.back().attrs["partial_sum"] = int_attribute(1);
          sum = part.outputs[0];
          continue;
        }
        Node add;
        add.op = "Add";
        add.name = fmt::format("{}.sum{}", conv.name, k);
        add.inputs = {part.outputs[0], sum};
        add.outputs = {k + 1 == parts ? conv.outputs[0]
                                      : fmt::format("{}.sum{}", conv.outputs[0], k)};
        g.shapes[add.outputs[0]] = out_shape;
        g.types[add.outputs[0]] = ElemType::f32;
        sum = add.outputs[0];
        nodes.push_back(std::move(add));
      }
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(*at));
      g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(*at), nodes.begin(),
                     nodes.end());
    }
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i)); // before every reader
    return true;
  }
  return false;
}

// A Pad of zeros on the two spatial axes of an NCHW map, read only by a convolution or by an
// AveragePool, becomes that node's own padding (exporters write one for a padding mode the op
// lacks, or for asymmetric padding): the same values, without a copy of the padded map made by a
// plain loop first. A convolution's padding is zeros already. An AveragePool counts the Pad's
// zeros in its averages, so it takes them as padding it counts (count_include_pad), which it may
// only where it had no padding of its own that it left out of the count, and where no window
// reaches past the padding (ceil_mode off). A MaxPool's padding is -inf, not zeros: not folded.
bool fold_zero_pad(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& pad = g.nodes[i];
    if (pad.op != "Pad" || pad.string_attr("mode", "constant") != "constant" ||
        pad.float_attr("value", 0) != 0.0f)
      continue;
    const auto p = pad.ints_attr("pads");
    if (p.size() != 8 || p[0] != 0 || p[1] != 0 || p[4] != 0 || p[5] != 0) continue;
    if (std::any_of(p.begin(), p.end(), [](std::int64_t v) { return v < 0; })) continue;
    const int r = sole_reader(g, pad.outputs[0]);
    if (r < 0) continue;
    Node& reader = g.nodes[static_cast<std::size_t>(r)];
    if (reader.inputs.empty() || reader.inputs[0] != pad.outputs[0] ||
        reader.ints_attr("pads").size() != 4)
      continue;
    if (reader.op == "AveragePool") {
      const auto own = reader.ints_attr("pads");
      const bool own_uncounted = reader.int_attr("count_include_pad", 0) == 0 &&
                                 std::any_of(own.begin(), own.end(), [](auto v) { return v != 0; });
      if (own_uncounted || reader.int_attr("ceil_mode", 0) != 0) continue;
      reader.attrs["count_include_pad"] = int_attribute(1);
    } else if (reader.op != "Conv" || !conv_geometry(g, reader)) {
      continue;
    }
    // ONNX's pads run begin values then end values: [n, c, h, w, n, c, h, w] for the Pad, and
    // [h, w, h, w] for the reader.
    auto& own = reader.attrs["pads"].ints;
    own = {own[0] + p[2], own[1] + p[3], own[2] + p[6], own[3] + p[7]};
    reader.inputs[0] = pad.inputs[0];
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }
  return false;
}

// The shape numpy broadcasting gives `a` and `b`, or nullopt where they do not broadcast.
std::optional<Shape> broadcast_shape(Shape a, Shape b) {
  while (a.size() < b.size()) a.insert(a.begin(), 1);
  while (b.size() < a.size()) b.insert(b.begin(), 1);
  for (std::size_t d = 0; d < a.size(); ++d) {
    if (a[d] == b[d] || b[d] == 1) continue;
    if (a[d] != 1) return std::nullopt;
    a[d] = b[d];
  }
  return a;
}

// An Expand read only by broadcasting arithmetic (Add, Sub, Mul, Div) whose other operand has the
// output's shape is left out: each reader broadcasts the Expand's input itself to the same output
// (broadcasts compose), without the expanded copy first (Swin V2's cosine attention divides by a
// norm expanded along the row).
bool skip_expand_into_arithmetic(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op != "Expand" || g.is_output(n.outputs[0])) continue;
    const std::string in = n.inputs[0], out = n.outputs[0];
    const auto readers = g.consumers(out);
    const bool all_arithmetic =
        !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](std::size_t r) {
          const Node& reader = g.nodes[r];
          if (reader.op != "Add" && reader.op != "Sub" && reader.op != "Mul" && reader.op != "Div")
            return false;
          const std::string other = other_operand(reader, out);
          if (other.empty() || other == out || !reader.post_ops.empty()) return false;
          // The other operand full-sized and, for Sub and Div, first: oneDNN's binary then
          // broadcasts the Expand's input as its second operand (the way it broadcasts).
          const bool commutative = reader.op == "Add" || reader.op == "Mul";
          if (!commutative && reader.inputs[1] != out) return false;
          const Shape& os = g.shape(reader.outputs[0]);
          return g.shape(other) == os && broadcast_shape(g.shape(in), os) == os;
        });
    if (!all_arithmetic) continue;
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    rename_uses(g, out, in);
    return true;
  }
  return false;
}

// Gelu in the erf form older exporters write, x * (Erf(x / sqrt(2)) + 1) * 0.5 (the division
// also as a product by 1/sqrt(2); sums and products either way round), becomes one Gelu.
bool fuse_erf_gelu(Graph& g) {
  const double root2 = std::sqrt(2.0);
  for (std::size_t ie = 0; ie < g.nodes.size(); ++ie) {
    if (g.nodes[ie].op != "Erf") continue;
    const int d = g.producer(g.nodes[ie].inputs[0]);
    if (d < 0 || sole_reader(g, g.nodes[ie].inputs[0]) != static_cast<int>(ie)) continue;
    const Node& scale = g.nodes[static_cast<std::size_t>(d)];
    std::string x;
    if (scale.op == "Div" && scale.inputs.size() == 2 && is_scalar(g, scale.inputs[1], root2))
      x = scale.inputs[0];
    for (int side = 0; side < 2 && scale.op == "Mul" && scale.inputs.size() == 2; ++side)
      if (is_scalar(g, scale.inputs[static_cast<std::size_t>(1 - side)], 1 / root2))
        x = scale.inputs[static_cast<std::size_t>(side)];
    if (x.empty() || g.is_constant(x)) continue;
    const int a = sole_reader(g, g.nodes[ie].outputs[0]);
    if (a < 0 || g.nodes[a].op != "Add" ||
        !is_scalar(g, other_operand(g.nodes[a], g.nodes[ie].outputs[0]), 1.0))
      continue;
    const int m = sole_reader(g, g.nodes[a].outputs[0]);
    if (m < 0 || g.nodes[m].op != "Mul" || other_operand(g.nodes[m], g.nodes[a].outputs[0]) != x)
      continue;
    const int h = sole_reader(g, g.nodes[m].outputs[0]);
    if (h < 0 || g.nodes[h].op != "Mul" ||
        !is_scalar(g, other_operand(g.nodes[h], g.nodes[m].outputs[0]), 0.5))
      continue;
    Node gelu;
    gelu.op = "Gelu";
    gelu.name = g.nodes[h].name;
    gelu.inputs = {x};
    gelu.outputs = g.nodes[h].outputs;
    gelu.attrs["alpha"] = float_attribute(0.f); // the erf form
    g.nodes[h] = std::move(gelu);
    std::vector<int> gone = {d, static_cast<int>(ie), a, m};
    std::sort(gone.rbegin(), gone.rend());
    for (const int k : gone) g.nodes.erase(g.nodes.begin() + k);
    return true;
  }
  return false;
}

// Layer normalization as exporters before opset 17 write it: m = ReduceMean(x) over trailing
// axes, d = x - m, y = d / Sqrt(ReduceMean(d^2) + eps), then optionally * Scale and + B (constants
// over the normalized axes), becomes one LayerNormalization.
bool fuse_decomposed_layer_norm(Graph& g) {
  const auto reader_of = [&](const std::string& value, const char* op) {
    const int r = sole_reader(g, value);
    return r >= 0 && g.nodes[static_cast<std::size_t>(r)].op == op ? r : -1;
  };
  for (std::size_t im = 0; im < g.nodes.size(); ++im) {
    const Node& mean = g.nodes[im];
    if (mean.op != "ReduceMean" || mean.int_attr("keepdims", 1) == 0) continue;
    const std::string x = mean.inputs[0];
    const Shape& xs = g.shape(x);
    const auto axes = mean.ints_attr("axes");
    const auto rank = static_cast<std::int64_t>(xs.size());
    if (axes.empty() || axes.back() != rank - 1 ||
        axes.front() != rank - static_cast<std::int64_t>(axes.size()))
      continue; // not the trailing axes
    // d = x - m, read by the square and the division only.
    const auto m_readers = g.consumers(mean.outputs[0]);
    if (m_readers.size() != 1 || g.is_output(mean.outputs[0])) continue;
    const int sub = static_cast<int>(m_readers.front());
    const Node& sn = g.nodes[static_cast<std::size_t>(sub)];
    if (sn.op != "Sub" || sn.inputs[0] != x || sn.inputs[1] != mean.outputs[0]) continue;
    const std::string d = sn.outputs[0];
    const auto d_readers = g.consumers(d);
    if (d_readers.size() != 2 || g.is_output(d)) continue;
    int pow = -1, div = -1;
    for (const auto r : d_readers) {
      const Node& n = g.nodes[r];
      if (n.op == "Pow" && n.inputs[0] == d && n.float_attr("beta", 0) == 2.f)
        pow = static_cast<int>(r);
      if (n.op == "Div" && n.inputs[0] == d) div = static_cast<int>(r);
    }
    if (pow < 0 || div < 0) continue;
    const int var = reader_of(g.nodes[pow].outputs[0], "ReduceMean");
    if (var < 0 || g.nodes[var].ints_attr("axes") != axes ||
        g.nodes[var].int_attr("keepdims", 1) == 0)
      continue;
    const int add_eps = reader_of(g.nodes[var].outputs[0], "Add");
    if (add_eps < 0) continue;
    const std::string eps_name = other_operand(g.nodes[add_eps], g.nodes[var].outputs[0]);
    if (!g.is_constant(eps_name) || g.constants.at(eps_name).size() != 1) continue;
    const int sqrt = reader_of(g.nodes[add_eps].outputs[0], "Sqrt");
    if (sqrt < 0 || g.nodes[div].inputs[1] != g.nodes[sqrt].outputs[0] ||
        sole_reader(g, g.nodes[sqrt].outputs[0]) != div)
      continue;
    // The optional affine part: constants that broadcast to the normalized axes alone.
    const Shape normalized(xs.end() - static_cast<std::ptrdiff_t>(axes.size()), xs.end());
    const auto over_row = [&](const std::string& c) {
      if (!g.is_constant(c)) return false;
      Shape cs = g.shape(c);
      while (!cs.empty() && cs.front() == 1 && cs.size() > normalized.size()) cs.erase(cs.begin());
      if (cs.size() > normalized.size()) return false;
      for (std::size_t k = 0; k < cs.size(); ++k)
        if (cs[cs.size() - 1 - k] != 1 &&
            cs[cs.size() - 1 - k] != normalized[normalized.size() - 1 - k])
          return false;
      return true;
    };
    int last = div;
    std::string scale, bias;
    if (const int mul = reader_of(g.nodes[last].outputs[0], "Mul"); mul >= 0) {
      const std::string c = other_operand(g.nodes[mul], g.nodes[last].outputs[0]);
      if (over_row(c)) {
        scale = c;
        last = mul;
      }
    }
    if (const int add = reader_of(g.nodes[last].outputs[0], "Add"); add >= 0) {
      const std::string c = other_operand(g.nodes[add], g.nodes[last].outputs[0]);
      if (over_row(c)) {
        bias = c;
        last = add;
      }
    }
    if (g.shape(g.nodes[last].outputs[0]) != xs) continue;
    Node ln;
    ln.op = "LayerNormalization";
    ln.name = g.nodes[last].name;
    ln.inputs = {x, scale, bias};
    ln.outputs = g.nodes[last].outputs;
    ln.attrs["axis"] = int_attribute(axes.front());
    ln.attrs["epsilon"] = float_attribute(static_cast<float>(g.constants.at(eps_name).at(0)));
    std::vector<int> gone = {static_cast<int>(im), sub, pow, var, add_eps, sqrt, div};
    for (int k = div; k != last;) { // the Mul and Add between the division and `last`
      k = sole_reader(g, g.nodes[k].outputs[0]);
      if (k != last) gone.push_back(k);
    }
    g.nodes[static_cast<std::size_t>(last)] = std::move(ln);
    std::sort(gone.rbegin(), gone.rend());
    gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
    for (const int k : gone)
      if (k != last) g.nodes.erase(g.nodes.begin() + k);
    return true;
  }
  return false;
}

// A constant that broadcasts against [N, C, positions...] as one value per channel (a scalar, or
// C values over the channel axis with ones after it): those C values, else nullopt.
std::optional<std::vector<float>> per_channel_constant(const Graph& g, const std::string& value,
                                                       const Shape& xs) {
  if (!g.is_constant(value)) return std::nullopt;
  Shape cs = g.shape(value);
  while (!cs.empty() && cs.front() == 1 && cs.size() > 1) cs.erase(cs.begin());
  const Tensor& t = g.constants.at(value);
  const auto c = static_cast<std::size_t>(xs[1]);
  if (t.size() == 1) return std::vector<float>(c, static_cast<float>(t.at(0)));
  if (cs.size() != xs.size() - 1 || cs[0] != xs[1] ||
      std::any_of(cs.begin() + 1, cs.end(), [](std::int64_t d) { return d != 1; }))
    return std::nullopt;
  std::vector<float> r(c);
  for (std::size_t k = 0; k < c; ++k) r[k] = static_cast<float>(t.at(static_cast<std::int64_t>(k)));
  return r;
}

// Group normalization as both exporters write torch's group_norm: x [N, C, positions...] reshaped
// to [N, G, rest], an InstanceNormalization over that (a scale and bias per group), reshaped back
// to x's shape, then optionally * Scale and + B per channel. It becomes one GroupNormalization over
// x (opset 21's: a scale and bias per channel, the group's folded in), so that the lowering can
// normalize x as it lies (channels-last after a convolution) instead of copying it to plain rows.
bool fuse_reshaped_group_norm(Graph& g) {
  const auto reader_of = [&](const std::string& value, const char* op) {
    const int r = sole_reader(g, value);
    return r >= 0 && g.nodes[static_cast<std::size_t>(r)].op == op && !g.is_output(value) ? r : -1;
  };
  for (std::size_t ir = 0; ir < g.nodes.size(); ++ir) {
    const Node& in_reshape = g.nodes[ir];
    if (in_reshape.op != "Reshape" || g.is_constant(in_reshape.inputs[0])) continue;
    const std::string x = in_reshape.inputs[0];
    const Shape& xs = g.shape(x);
    const Shape& rs = g.shape(in_reshape.outputs[0]);
    if (xs.size() < 3 || rs.size() != 3 || rs[0] != xs[0] || rs[1] < 1 || xs[1] % rs[1] != 0 ||
        rs[2] * rs[1] != numel(xs) / xs[0])
      continue;
    const std::int64_t groups = rs[1], c = xs[1];
    const int in = reader_of(in_reshape.outputs[0], "InstanceNormalization");
    if (in < 0 || g.nodes[in].inputs[0] != in_reshape.outputs[0]) continue;
    const Node& norm = g.nodes[static_cast<std::size_t>(in)];
    if (norm.inputs.size() < 3 || !g.is_constant(norm.inputs[1]) ||
        !g.is_constant(norm.inputs[2]) || g.constants.at(norm.inputs[1]).size() != groups ||
        g.constants.at(norm.inputs[2]).size() != groups)
      continue;
    const int back = reader_of(norm.outputs[0], "Reshape");
    if (back < 0 || g.shape(g.nodes[back].outputs[0]) != xs) continue;
    // y = (xhat * s_g + b_g) * scale_c + bias_c = xhat * (s_g scale_c) + (b_g scale_c + bias_c)
    std::vector<float> scale(static_cast<std::size_t>(c)), bias(static_cast<std::size_t>(c));
    const Tensor& sg = g.constants.at(norm.inputs[1]);
    const Tensor& bg = g.constants.at(norm.inputs[2]);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      scale[static_cast<std::size_t>(ch)] = static_cast<float>(sg.at(ch / (c / groups)));
      bias[static_cast<std::size_t>(ch)] = static_cast<float>(bg.at(ch / (c / groups)));
    }
    int last = back;
    std::vector<int> gone = {static_cast<int>(ir), in, back};
    if (const int mul = reader_of(g.nodes[last].outputs[0], "Mul"); mul >= 0) {
      const auto k =
          per_channel_constant(g, other_operand(g.nodes[mul], g.nodes[last].outputs[0]), xs);
      if (k && g.shape(g.nodes[mul].outputs[0]) == xs) {
        for (std::size_t ch = 0; ch < scale.size(); ++ch) {
          scale[ch] *= (*k)[ch];
          bias[ch] *= (*k)[ch];
        }
        last = mul;
        gone.push_back(mul);
      }
    }
    if (const int add = reader_of(g.nodes[last].outputs[0], "Add"); add >= 0) {
      const auto k =
          per_channel_constant(g, other_operand(g.nodes[add], g.nodes[last].outputs[0]), xs);
      if (k && g.shape(g.nodes[add].outputs[0]) == xs) {
        for (std::size_t ch = 0; ch < bias.size(); ++ch) bias[ch] += (*k)[ch];
        last = add;
        gone.push_back(add);
      }
    }
    Node gn;
    gn.op = "GroupNormalization";
    gn.name = g.nodes[last].name;
    const std::string sname = norm.name + ".group_scale", bname = norm.name + ".group_bias";
    g.constants[sname] = Tensor::floats({c}, std::move(scale));
    g.constants[bname] = Tensor::floats({c}, std::move(bias));
    g.shapes[sname] = {c};
    g.shapes[bname] = {c};
    gn.inputs = {x, sname, bname};
    gn.outputs = g.nodes[last].outputs;
    gn.attrs["num_groups"] = int_attribute(groups);
    gn.attrs["epsilon"] = float_attribute(norm.float_attr("epsilon", 1e-5f));
    g.nodes[static_cast<std::size_t>(last)] = std::move(gn);
    std::sort(gone.rbegin(), gone.rend());
    for (const int k : gone)
      if (k != last) g.nodes.erase(g.nodes.begin() + k);
    return true;
  }
  return false;
}

// The value of a one-element constant, or nullopt.
std::optional<float> scalar_of(const Graph& g, const std::string& value) {
  if (!g.is_constant(value) || g.constants.at(value).size() != 1) return std::nullopt;
  return static_cast<float>(g.constants.at(value).at(0));
}

// What node `n` computes when it is x times a constant scalar k (Mul either way round, or Div by
// it) and keeps x's shape: {x, k}.
std::optional<std::pair<std::string, float>> scaling_of(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2) return std::nullopt;
  for (int side = 0; side < 2 && (n.op == "Mul" || (n.op == "Div" && side == 0)); ++side) {
    const std::string& x = n.inputs[static_cast<std::size_t>(side)];
    const auto k = scalar_of(g, n.inputs[static_cast<std::size_t>(1 - side)]);
    if (!k || g.is_constant(x) || g.shape(x) != g.shape(n.outputs[0])) continue;
    if (n.op == "Div" && *k == 0) continue;
    return std::pair{x, n.op == "Div" ? 1.f / *k : *k};
  }
  return std::nullopt;
}

// A product scaled by constants, as attention writes it (q * s and k * s before the product, or
// the product / sqrt(d) after it): the scale joins the MatMul's (or Gemm's) alpha, which the
// lowering gives oneDNN's matmul as a weights scale (or folds into constant weights), and the Mul
// or Div goes. After the product only while nothing is fused into it yet (a Gemm's beta * C scales
// too).
bool fuse_product_scale(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node& mm = g.nodes[i];
    if ((mm.op != "MatMul" && mm.op != "Gemm") || mm.inputs.size() < 2) continue;
    for (std::size_t side = 0; side < 2; ++side) {
      const int p = g.producer(mm.inputs[side]);
      if (p < 0 || sole_reader(g, mm.inputs[side]) != static_cast<int>(i)) continue;
      const auto scaled = scaling_of(g, g.nodes[static_cast<std::size_t>(p)]);
      if (!scaled) continue;
      mm.inputs[side] = scaled->first;
      mm.attrs["alpha"] = float_attribute(mm.float_attr("alpha", 1) * scaled->second);
      g.nodes.erase(g.nodes.begin() + p);
      return true;
    }
    const int r = sole_reader(g, mm.outputs[0]);
    if (r < 0 || !mm.post_ops.empty()) continue;
    const auto scaled = scaling_of(g, g.nodes[static_cast<std::size_t>(r)]);
    if (!scaled || scaled->first != mm.outputs[0]) continue;
    mm.attrs["alpha"] = float_attribute(mm.float_attr("alpha", 1) * scaled->second);
    if (has_input(mm, 2))
      mm.attrs["beta"] = float_attribute(mm.float_attr("beta", 1) * scaled->second);
    mm.outputs[0] = g.nodes[static_cast<std::size_t>(r)].outputs[0];
    g.nodes.erase(g.nodes.begin() + r);
    return true;
  }
  return false;
}

// A linear layer as the dynamo exporter writes it, MatMul(A, W) with a constant 2-D W and A of any
// rank, then Add(bias) over the last axis and an activation, each optional: one Gemm over A's rows
// (a view of A as [rows, K]) with the bias and the activation fused, viewed back to A's leading
// axes. oneDNN then runs one inner product with the rows blocked together, where the MatMul ran as
// a broadcast matmul followed by a binary add and an eltwise pass over the whole tensor.
bool matmul_as_gemm(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& mm = g.nodes[i];
    if (mm.op != "MatMul" || !g.is_constant(mm.inputs[1]) || g.is_constant(mm.inputs[0])) continue;
    const Shape& as = g.shape(mm.inputs[0]);
    const Shape& ws = g.shape(mm.inputs[1]);
    if (ws.size() != 2 || as.size() < 2 || as.back() != ws[0]) continue;
    const std::int64_t k = ws[0], n = ws[1], rows = numel(as) / k;
    std::string out = mm.outputs[0];
    std::string bias;
    std::vector<int> gone;
    if (const int add = sole_reader(g, out); add >= 0 && g.nodes[add].op == "Add") {
      const std::string c = other_operand(g.nodes[add], out);
      const bool per_column = g.is_constant(c) && g.constants.at(c).size() == n &&
                              !g.shape(c).empty() && g.shape(c).back() == n &&
                              g.shape(c).size() <= as.size();
      if (per_column && g.shape(g.nodes[add].outputs[0]) == g.shape(out)) {
        bias = c;
        out = g.nodes[add].outputs[0];
        gone.push_back(add);
      }
    }
    if (as.size() == 2 && bias.empty()) continue; // already one inner product
    // The activation after it, if any, joins before the view back.
    std::optional<Node> act;
    if (const int a = sole_reader(g, out); a >= 0 && as.size() > 2) {
      const OpDef* op = find_op(g.nodes[a].op);
      if (op != nullptr && op->activation != nullptr) {
        act = g.nodes[a];
        out = g.nodes[a].outputs[0];
        gone.push_back(a);
      }
    }
    const Shape out_shape = g.shape(out);
    const std::string base = mm.name + ".rows";
    std::vector<Node> nodes;
    std::string a_rows = mm.inputs[0];
    if (as.size() > 2) {
      a_rows = base + ".in";
      const std::string shape_name = base + ".in_shape";
      g.constants[shape_name] = Tensor::ints({2}, {rows, k});
      g.shapes[shape_name] = {2};
      g.types[shape_name] = ElemType::i64;
      g.shapes[a_rows] = {rows, k};
      g.types[a_rows] = ElemType::f32;
      Node view;
      view.op = "Reshape";
      view.name = base + ".view_in";
      view.inputs = {mm.inputs[0], shape_name};
      view.outputs = {a_rows};
      nodes.push_back(std::move(view));
    }
    Node gemm;
    gemm.op = "Gemm";
    gemm.name = mm.name;
    gemm.inputs = {a_rows, mm.inputs[1]};
    if (!bias.empty()) gemm.inputs.push_back(bias);
    gemm.attrs["alpha"] = float_attribute(mm.float_attr("alpha", 1)); // fuse_product_scale's
    gemm.attrs["beta"] = float_attribute(1.f);
    gemm.attrs["transA"] = int_attribute(0);
    gemm.attrs["transB"] = int_attribute(0);
    const std::string g_out = as.size() > 2 ? base + ".out" : out;
    gemm.outputs = {act ? base + ".product" : g_out};
    g.shapes[gemm.outputs[0]] = {rows, n};
    g.types[gemm.outputs[0]] = ElemType::f32;
    nodes.push_back(std::move(gemm));
    if (act) {
      act->inputs[0] = nodes.back().outputs[0];
      act->outputs = {g_out};
      nodes.push_back(std::move(*act));
    }
    if (as.size() > 2) {
      g.shapes[g_out] = {rows, n};
      g.types[g_out] = ElemType::f32;
      const std::string shape_name = base + ".out_shape";
      g.constants[shape_name] = Tensor::ints({static_cast<std::int64_t>(out_shape.size())},
                                             std::vector<std::int64_t>(out_shape));
      g.shapes[shape_name] = {static_cast<std::int64_t>(out_shape.size())};
      g.types[shape_name] = ElemType::i64;
      Node view;
      view.op = "Reshape";
      view.name = base + ".view_out";
      view.inputs = {g_out, shape_name};
      view.outputs = {out};
      nodes.push_back(std::move(view));
    }
    std::sort(gone.rbegin(), gone.rend());
    for (const int k2 : gone) g.nodes.erase(g.nodes.begin() + k2);
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(i), nodes.begin(), nodes.end());
    return true;
  }
  return false;
}

// A constant scale per output channel of a linear layer (a ConvNeXt's layer scale: Mul by a
// [C, 1, 1] parameter after the block's second Linear, permuted back to channels-first) is folded
// into the layer's constant weights and bias, through the reshapes and transposes between them
// that carry its output channel axis, and the Mul goes: its readers read what it scaled. Only
// where the layer has no post-op yet (the scale is after any activation), and each value on the
// way has no other reader. The folded weights are new constants (another node may share the
// layer's), named by the layer's output.
bool fold_channel_scale_into_gemm(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& mul = g.nodes[i];
    if (mul.op != "Mul" || mul.inputs.size() != 2 || g.is_output(mul.outputs[0])) continue;
    for (std::size_t side = 0; side < 2; ++side) {
      const std::string& x = mul.inputs[side];
      const std::string& c = mul.inputs[1 - side];
      const Shape& os = g.shape(mul.outputs[0]);
      if (g.is_constant(x) || !g.is_constant(c) || g.shape(x) != os) continue;
      const Tensor& scale = g.constants.at(c);
      const Shape& cs = g.shape(c);
      if (cs.size() > os.size() || scale.f.size() != static_cast<std::size_t>(numel(cs))) continue;
      // the one axis of the output the scale varies along
      std::optional<std::size_t> axis;
      bool per_axis = true;
      for (std::size_t k = 0; k < cs.size(); ++k) {
        if (cs[k] == 1) continue;
        const std::size_t at = os.size() - cs.size() + k;
        if (axis || cs[k] != os[at]) per_axis = false;
        axis = at;
      }
      if (!per_axis || !axis) continue;
      // back through the views to the layer, following the axis
      std::string cur = x;
      std::size_t k = *axis;
      int layer = -1;
      while (true) {
        if (g.is_output(cur) || g.consumers(cur).size() != 1) break;
        const int p = g.producer(cur);
        if (p < 0) break;
        const Node& n = g.nodes[static_cast<std::size_t>(p)];
        const Shape& in = g.shape(n.inputs[0]);
        if (n.op == "Transpose") {
          auto perm = n.ints_attr("perm");
          if (perm.empty())
            for (std::size_t d = in.size(); d-- > 0;) perm.push_back(static_cast<std::int64_t>(d));
          if (k >= perm.size()) break;
          k = static_cast<std::size_t>(perm[k]);
        } else if (n.op == "Reshape") {
          const Shape& out = g.shape(cur);
          if (k + 1 != out.size() || in.empty() || in.back() != out.back()) break;
          k = in.size() - 1;
        } else {
          if (n.op == "Gemm" && in.size() == 2 && k == 1) layer = p;
          break;
        }
        cur = n.inputs[0];
      }
      if (layer < 0) continue;
      Node& gemm = g.nodes[static_cast<std::size_t>(layer)];
      const std::int64_t cols = g.shape(gemm.outputs[0])[1];
      const bool trans_b = gemm.int_attr("transB", 0) != 0;
      if (!gemm.post_ops.empty() || !g.is_constant(gemm.inputs[1])) continue;
      const Tensor& w = g.constants.at(gemm.inputs[1]);
      const Shape& ws = g.shape(gemm.inputs[1]);
      if (ws.size() != 2 || w.f.size() != static_cast<std::size_t>(numel(ws)) ||
          ws[trans_b ? 0 : 1] != cols)
        continue;
      const bool has_bias = gemm.inputs.size() > 2 && !gemm.inputs[2].empty();
      if (has_bias) {
        const std::string& bias = gemm.inputs[2];
        if (!g.is_constant(bias)) continue;
        const Shape& bs = g.shape(bias);
        const auto n = static_cast<std::size_t>(numel(bs));
        if (g.constants.at(bias).f.size() != n ||
            !(n == 1 || (n == static_cast<std::size_t>(cols) && bs.back() == cols)))
          continue;
      }
      std::vector<float> weights = w.f;
      for (std::size_t e = 0; e < weights.size(); ++e) {
        const std::size_t col =
            trans_b ? e / static_cast<std::size_t>(ws[1]) : e % static_cast<std::size_t>(ws[1]);
        weights[e] *= scale.f[col];
      }
      const std::string wname = gemm.outputs[0] + ".scaled_weight";
      g.constants[wname] = Tensor::floats(ws, std::move(weights));
      g.shapes[wname] = ws;
      g.types[wname] = ElemType::f32;
      gemm.inputs[1] = wname;
      if (has_bias) {
        const Tensor& b = g.constants.at(gemm.inputs[2]);
        std::vector<float> bias(static_cast<std::size_t>(cols));
        for (std::size_t col = 0; col < bias.size(); ++col)
          bias[col] = b.f[b.f.size() == 1 ? 0 : col] * scale.f[col];
        const std::string bname = gemm.outputs[0] + ".scaled_bias";
        g.constants[bname] = Tensor::floats({cols}, std::move(bias));
        g.shapes[bname] = {cols};
        g.types[bname] = ElemType::f32;
        gemm.inputs[2] = bname;
      }
      const std::string out = mul.outputs[0], scaled = x;
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
      rename_uses(g, out, scaled);
      return true;
    }
  }
  return false;
}

// Conv/Gemm -> activation (sole reader) becomes one node with an eltwise post-op.
bool fuse_activation(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& act = g.nodes[i];
    if (!is_activation(act)) continue;
    const int p = g.producer(act.inputs[0]);
    if (p < 0 || post_ops_of(g, g.nodes[p]) == PostOps::none ||
        g.consumers(act.inputs[0]).size() != 1 || g.is_output(act.inputs[0]))
      continue;
    absorb(g, static_cast<std::size_t>(p), activation_post_op(act), i);
    return true;
  }
  return false;
}

// Add(conv_out, other) -> conv (or another op that takes a sum post-op) accumulates into other's
// buffer (sum post-op), when other is dead after the conv runs and shapes match exactly.
bool fuse_residual(Graph& g) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (add.op != "Add" || add.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& mine = add.inputs[static_cast<std::size_t>(side)];
      const std::string& other = add.inputs[static_cast<std::size_t>(1 - side)];
      const int p = g.producer(mine);
      if (p < 0 || post_ops_of(g, g.nodes[p]) != PostOps::eltwise_and_sum ||
          g.consumers(mine).size() != 1 || g.is_output(mine))
        continue;
      // One residual sum per product: it writes over that summand's buffer, so a second sum
      // (Add(Add(conv, a), b)) stays an Add.
      const auto& posts = g.nodes[static_cast<std::size_t>(p)].post_ops;
      if (std::any_of(posts.begin(), posts.end(),
                      [](const PostOp& o) { return o.kind == PostOp::Kind::sum; }))
        continue;
      if (g.is_constant(other) || other == g.input || g.is_output(other)) continue;
      if (g.shape(other) != g.shape(mine)) continue;
      const int q = g.producer(other);
      if (q < 0 || q >= p) continue; // other must be ready before the conv writes over it
      // Nor may the conv read it: a convolution written over its own input reads neighbours it
      // has already overwritten (relu(x) -> conv -> + relu(x): wrong sums, by thread timing).
      const auto& conv_inputs = g.nodes[static_cast<std::size_t>(p)].inputs;
      if (std::find(conv_inputs.begin(), conv_inputs.end(), other) != conv_inputs.end()) continue;
      bool dead = true; // no reader of other may run after the conv
      for (const auto reader : g.consumers(other))
        if (reader != i && static_cast<int>(reader) > p) dead = false;
      for (const auto& n : g.nodes)
        for (const auto& post : n.post_ops)
          if (post.sum_input == other) dead = false;
      if (!dead) continue;
      PostOp post;
      post.kind = PostOp::Kind::sum;
      post.op = "Add";
      post.sum_input = other;
      post.fused_node = add.name;
      absorb(g, static_cast<std::size_t>(p), std::move(post), i);
      return true;
    }
  }
  return false;
}

} // namespace

void run_passes(Graph& g) {
  while (remove_noops(g)) {
  }
  while (skip_expand_into_arithmetic(g)) {
  }
  while (fold_batchnorm(g)) {
  }
  while (fold_zero_pad(g)) {
  }
  while (trim_padding_taps(g)) {
  }
  while (pool_before_concat(g)) {
  }
  while (split_conv_over_concat(g)) {
  }
  while (fuse_silu(g)) {
  }
  while (fuse_erf_gelu(g)) {
  }
  while (fuse_decomposed_layer_norm(g)) {
  }
  while (fuse_reshaped_group_norm(g)) {
  }
  while (fuse_product_scale(g)) {
  }
  while (matmul_as_gemm(g)) {
  }
  while (fold_channel_scale_into_gemm(g)) {
  }
  bool changed = true;
  while (changed) {
    changed = false;
    while (fuse_residual(g)) changed = true;
    while (fuse_activation(g)) changed = true;
  }
}

GraphSummary summarize(const Graph& g) {
  GraphSummary s;
  s.nodes = g.nodes.size();
  std::vector<std::string> counted;
  for (const auto& n : g.nodes) {
    s.fused_post_ops += n.post_ops.size();
    for (const auto& in : n.inputs)
      if (!in.empty() && g.is_constant(in) &&
          std::find(counted.begin(), counted.end(), in) == counted.end()) {
        counted.push_back(in);
        s.parameters += g.constants.at(in).size();
      }
    const OpDef* op = find_op(n.op);
    if (op != nullptr && op->flops_per_sample != nullptr)
      s.flops_per_sample += op->flops_per_sample(g, n);
  }
  return s;
}

std::string describe_graph(const Graph& g) {
  std::string out;
  for (const auto& n : g.nodes) {
    std::string post;
    if (n.op == "MatMul" && n.float_attr("alpha", 1) != 1)
      post += fmt::format(" x{:.6g}", n.float_attr("alpha", 1));
    for (const auto& p : n.post_ops)
      post += p.kind == PostOp::Kind::sum ? fmt::format(" +sum({})", p.sum_input)
                                          : fmt::format(" +{}", p.op);
    out += fmt::format("  {:<18} {:<40} -> {}{}\n", n.op, n.name.substr(0, 40),
                       format_shape(g.shape(n.outputs[0])), post);
  }
  return out;
}

} // namespace kdflow::teacher
