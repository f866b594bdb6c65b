// Teacher execution plan: one oneDNN primitive (or, rarely, a plain kernel) per remaining node,
// layouts chosen by the primitives, reorders inserted only where a consumer wants another layout
// (in practice: at the graph input and outputs), everything allocated before the first batch.
#include "kdflow/cpu_teacher/engine.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/reference.hpp"
#include "kdflow/cpu_teacher/versions.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

namespace kdflow::teacher {

using dnnl::memory;
using dt = memory::data_type;

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::fp32;
  if (text == "bf16") return Precision::bf16;
  throw InputError(fmt::format("precision '{}' is not fp32 or bf16", text));
}

const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : "bf16"; }

bool has_native_bf16() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx ||
         isa == dnnl::cpu_isa::avx512_core_amx_fp16 || isa == dnnl::cpu_isa::avx2_vnni_2;
}

namespace {

// Where a step's operand lives. Buffers are per replica; weights are shared by all replicas.
struct ArgRef {
  enum class Kind { buffer, weight, input, output } kind = Kind::buffer;
  int index = 0;          // buffer, weight or output number
  std::size_t offset = 0; // bytes into the buffer (views: slices, splits)
  memory::desc md;
};

// A plain kernel for op variants without a primitive; it gets one pointer per operand.
using Kernel = std::function<void(std::byte* const* ptrs)>;

struct Step {
  std::optional<dnnl::primitive> prim;
  Kernel kernel;
  std::vector<std::pair<int, ArgRef>> args; // (DNNL_ARG_*, operand); kernels: positional
  std::string label;
  std::string kind; // StepInfo::kind
  bool reorder = false;
};

// The implementation oneDNN chose for a primitive ("jit_dw:avx512_core_bf16").
std::string impl_of(const dnnl::primitive& prim) {
  const_dnnl_primitive_desc_t pd = nullptr;
  const char* impl = nullptr;
  if (dnnl_primitive_get_primitive_desc(prim.get(), &pd) != dnnl_success ||
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
      impl == nullptr)
    return "unknown";
  return impl;
}

memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

memory::desc plain(const Shape& s, dt type) {
  memory::dims strides(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) strides[d - 1] = strides[d] * s[d];
  return memory::desc(dims_of(s), type, strides);
}

dnnl::algorithm eltwise_alg(const std::string& op) {
  if (op == "Relu" || op == "LeakyRelu") return dnnl::algorithm::eltwise_relu;
  if (op == "Clip") return dnnl::algorithm::eltwise_clip_v2;
  if (op == "Sigmoid") return dnnl::algorithm::eltwise_logistic;
  if (op == "HardSigmoid") return dnnl::algorithm::eltwise_hardsigmoid;
  if (op == "HardSwish") return dnnl::algorithm::eltwise_hardswish;
  throw std::logic_error("no eltwise algorithm for " + op);
}

std::pair<float, float> eltwise_params(const std::string& op, float alpha, float beta) {
  if (op == "Relu") return {0.f, 0.f};
  if (op == "HardSwish") return {1.f / 6.f, 0.5f};
  return {alpha, beta};
}

// oneDNN reports failures as dnnl::error with a status; add the node that was being built.
template <typename F>
auto with_node(const Node& node, const std::string& file, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw InputError(
        fmt::format("{}: {}: oneDNN cannot build it ({})", file, node.describe(), e.what()));
  }
}

} // namespace

struct Teacher::Plan {
  Graph graph;
  Precision precision = Precision::fp32;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::vector<std::size_t> buffer_bytes;
  std::vector<memory> weights;
  std::vector<std::vector<float>> weight_storage; // f32 data behind user-layout weights
  std::vector<Step> steps;
  std::size_t scratchpad_bytes = 0;
  memory::desc input_md;
  struct Output {
    std::string name;
    Shape shape;
    memory::desc md;
  };
  std::vector<Output> outputs;
};

namespace {

class Builder {
public:
  Builder(Teacher::Plan& plan)
      : p_(plan), g_(plan.graph), act_(plan.precision == Precision::bf16 ? dt::bf16 : dt::f32) {}

  void build(const std::vector<std::string>& features) {
    p_.input_md = plain(g_.input_shape, dt::f32);
    loc_[g_.input] = ArgRef{ArgRef::Kind::input, 0, 0, p_.input_md};
    find_flatten_into_gemm();
    for (const auto& node : g_.nodes) {
      if (skipped_.count(node.name)) continue;
      with_node(node, g_.file, [&] {
        add_node(node);
        return 0;
      });
    }
    std::vector<std::string> outs = g_.outputs;
    for (const auto& f : features) {
      if (!g_.shapes.count(f) || g_.is_constant(f))
        throw InputError(
            fmt::format("{}: no intermediate value named '{}' to return as a feature", g_.file, f));
      if (!loc_.count(f))
        throw InputError(fmt::format("{}: value '{}' was fused away by kdflow's passes; ask for "
                                     "the output of the fused group",
                                     g_.file, f));
      outs.push_back(f);
    }
    for (std::size_t k = 0; k < outs.size(); ++k) {
      const Shape& s = g_.shape(outs[k]);
      const memory::desc user = plain(s, dt::f32);
      p_.outputs.push_back({outs[k], s, user});
      const ArgRef src = at(outs[k]);
      add_reorder(src, ArgRef{ArgRef::Kind::output, static_cast<int>(k), 0, user},
                  "output " + outs[k]);
    }
  }

private:
  // --- values ------------------------------------------------------------------------------
  const ArgRef& at(const std::string& value) {
    const auto it = loc_.find(value);
    if (it == loc_.end())
      throw std::logic_error("teacher plan: value '" + value + "' not computed");
    return it->second;
  }

  ArgRef new_buffer(const memory::desc& md) {
    p_.buffer_bytes.push_back(md.get_size());
    return ArgRef{ArgRef::Kind::buffer, static_cast<int>(p_.buffer_bytes.size() - 1), 0, md};
  }

  void add_reorder(const ArgRef& src, const ArgRef& dst, const std::string& label) {
    const dnnl::reorder::primitive_desc pd(p_.eng, src.md, p_.eng, dst.md);
    Step s;
    s.prim = dnnl::reorder(pd);
    s.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    s.label = "reorder " + label;
    s.kind = "reorder";
    s.reorder = true;
    p_.steps.push_back(std::move(s));
  }

  // `value` in layout `want`, reordered once (and cached) when it lives in another layout.
  ArgRef get(const std::string& value, const memory::desc& want) {
    const ArgRef& cur = at(value);
    if (cur.md == want) return cur;
    for (const auto& [name, ref] : converted_)
      if (name == value && ref.md == want) return ref;
    ArgRef dst = new_buffer(want);
    add_reorder(cur, dst, value);
    converted_.emplace_back(value, dst);
    return dst;
  }

  ArgRef get_plain(const std::string& value, dt type) {
    return get(value, plain(g_.shape(value), type));
  }

  void set(const std::string& value, ArgRef ref) {
    loc_[value] = std::move(ref);
    converted_.erase(std::remove_if(converted_.begin(), converted_.end(),
                                    [&](const auto& c) { return c.first == value; }),
                     converted_.end());
  }

  // A constant in the layout a primitive asked for, reordered once at load.
  ArgRef weight(std::vector<float> data, const memory::desc& user_md, const memory::desc& want) {
    p_.weight_storage.push_back(std::move(data));
    memory user(user_md, p_.eng, p_.weight_storage.back().data());
    memory w(want, p_.eng);
    dnnl::stream s(p_.eng);
    dnnl::reorder(user, w).execute(s, user, w);
    s.wait();
    p_.weights.push_back(w);
    return ArgRef{ArgRef::Kind::weight, static_cast<int>(p_.weights.size() - 1), 0, want};
  }

  ArgRef constant(const std::string& name, const Shape& as_shape) {
    const Tensor& t = g_.constants.at(name);
    std::vector<float> data(static_cast<std::size_t>(t.size()));
    for (std::int64_t k = 0; k < t.size(); ++k)
      data[static_cast<std::size_t>(k)] = static_cast<float>(t.at(k));
    const memory::desc md = plain(as_shape, dt::f32);
    return weight(std::move(data), md, md);
  }

  void add_primitive(dnnl::primitive prim, std::vector<std::pair<int, ArgRef>> args,
                     const std::string& label, const memory::desc& scratchpad) {
    p_.scratchpad_bytes = std::max(p_.scratchpad_bytes, scratchpad.get_size());
    Step s;
    s.prim = std::move(prim);
    s.args = std::move(args);
    s.label = label;
    s.kind = kind_;
    p_.steps.push_back(std::move(s));
  }

  void add_kernel(Kernel k, std::vector<ArgRef> operands, const std::string& label) {
    Step s;
    s.kernel = std::move(k);
    for (auto& o : operands) s.args.emplace_back(0, std::move(o));
    s.label = label + " (plain kernel)";
    s.kind = kind_;
    p_.steps.push_back(std::move(s));
  }

  dnnl::primitive_attr attr_with(const Node& node) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::post_ops ops;
    for (const auto& post : node.post_ops) {
      if (post.kind == PostOp::Kind::sum) {
        ops.append_sum(1.f);
      } else {
        const auto [a, b] = eltwise_params(post.op, post.alpha, post.beta);
        ops.append_eltwise(eltwise_alg(post.op), a, b);
      }
    }
    attr.set_post_ops(ops);
    return attr;
  }

  static dnnl::primitive_attr plain_attr() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  const PostOp* sum_post(const Node& node) {
    for (const auto& p : node.post_ops)
      if (p.kind == PostOp::Kind::sum) return &p;
    return nullptr;
  }

  // --- Flatten/Reshape feeding a Gemm: the inner product reads the 4-D tensor directly ----------
  void find_flatten_into_gemm() {
    for (const auto& n : g_.nodes) {
      if ((n.op != "Gemm" && n.op != "MatMul") || !g_.is_constant(n.inputs[1])) continue;
      if (n.op == "Gemm" && n.int_attr("transA", 0)) continue;
      for (const auto& f : g_.nodes) {
        if ((f.op != "Flatten" && f.op != "Reshape") || f.outputs[0] != n.inputs[0]) continue;
        const Shape& in = g_.shape(f.inputs[0]);
        const Shape& out = g_.shape(f.outputs[0]);
        if (in.size() == 4 && out.size() == 2 && out[0] == in[0] &&
            g_.consumers(f.outputs[0]).size() == 1 && !g_.is_output(f.outputs[0]) &&
            !g_.is_constant(f.inputs[0])) {
          skipped_.insert(f.name);
          flat_source_[n.name] = f.inputs[0];
        }
      }
    }
  }

  // --- nodes ---------------------------------------------------------------------------------
  void add_node(const Node& node) {
    const std::string& op = node.op;
    kind_ = op;
    if (op == "Conv") return conv(node);
    if (op == "Gemm" || op == "MatMul") {
      if (g_.is_constant(node.inputs[1])) return inner_product(node);
      return matmul(node);
    }
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool") return pool(node);
    if (op == "ReduceMean") return reduce_mean(node);
    if (op == "Relu" || op == "LeakyRelu" || op == "Clip" || op == "Sigmoid" ||
        op == "HardSigmoid" || op == "HardSwish")
      return eltwise(node);
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") return binary(node);
    if (op == "Concat") return concat(node);
    if (op == "Flatten" || op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" ||
        op == "Identity" || op == "Dropout")
      return reshape(node);
    if (op == "Transpose") return transpose(node);
    if (op == "Slice" || op == "Split") return slice(node);
    if (op == "Pad") return pad(node);
    if (op == "Softmax") return softmax(node);
    if (op == "BatchNormalization")
      throw InputError(
          fmt::format("{}: {}: BatchNormalization with non-constant parameters is not supported",
                      g_.file, node.describe()));
    throw InputError(fmt::format("{}: {}: op type '{}' is not supported by kdflow's teacher",
                                 g_.file, node.describe(), op));
  }

  // A pointwise convolution (1x1, stride 1, no padding, one group) reading a channels-last tensor
  // that its residual operand, if any, shares: with channels-last input and output every pixel of
  // the batch is a row of one matrix product. oneDNN's 1x1 convolution blocks its rows within one
  // image's map, so on small maps (2x2: four rows) its kernels starve; the inner product blocks
  // all N*H*W rows at once.
  bool pointwise_on_channels_last(const Node& node) {
    if (node.int_attr("group", 1) != 1) return false;
    const Shape& ws = g_.shape(node.inputs[1]);
    if (ws.size() != 4 || ws[2] != 1 || ws[3] != 1) return false;
    for (const auto v : node.ints_attr("strides"))
      if (v != 1) return false;
    for (const auto v : node.ints_attr("pads"))
      if (v != 0) return false;
    const auto last = [&](const std::string& value) {
      return at(value).md == memory::desc(dims_of(g_.shape(value)), act_, memory::format_tag::acdb);
    };
    const PostOp* sum = sum_post(node);
    return last(node.inputs[0]) && (!sum || last(sum->sum_input));
  }

  // A convolution run as one inner product over channels-last views of its input and output:
  // either unrolled by the passes (unroll_tiny_maps: each sample's whole map is one row, the
  // weights are OC*OH*OW x C*IH*IW) or pointwise (each pixel is a row, the weights OC x C).
  void matrix_conv(const Node& node) {
    kind_ = node.has("kdflow_unrolled") ? "Conv (unrolled)" : "Conv (pointwise)";
    const Shape& xs = g_.shape(node.inputs[0]);
    const Shape& os = g_.shape(node.outputs[0]);
    const Shape& ws = g_.shape(node.inputs[1]);
    const std::int64_t rows = node.has("kdflow_unrolled") ? xs[0] : xs[0] * xs[2] * xs[3];
    const auto tag = memory::format_tag::acdb;
    const memory::desc src_map(dims_of(xs), act_, tag), dst_map(dims_of(os), act_, tag);
    const memory::desc src_row({rows, ws[1]}, act_, memory::format_tag::ab);
    const memory::desc dst_row({rows, ws[0]}, act_, memory::format_tag::ab);
    const memory::desc w_user({ws[0], ws[1]}, dt::f32, memory::format_tag::oi);
    const memory::desc any_w({ws[0], ws[1]}, act_, memory::format_tag::any);
    const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
    const memory::desc bias_md({ws[0]}, dt::f32, memory::format_tag::a);
    const auto attr = attr_with(node);
    const auto pd =
        has_bias
            ? dnnl::inner_product_forward::primitive_desc(p_.eng,
                                                          dnnl::prop_kind::forward_inference,
                                                          src_row, any_w, bias_md, dst_row, attr)
            : dnnl::inner_product_forward::primitive_desc(
                  p_.eng, dnnl::prop_kind::forward_inference, src_row, any_w, dst_row, attr);
    ArgRef src = get(node.inputs[0], src_map);
    src.md = src_row;
    const PostOp* sum = sum_post(node);
    // With a residual sum it accumulates into the other operand (channels-last, dead after it).
    ArgRef dst = sum ? get(sum->sum_input, dst_map) : new_buffer(dst_map);
    ArgRef dst_view = dst;
    dst_view.md = dst_row;
    std::vector<std::pair<int, ArgRef>> args = {
        {DNNL_ARG_SRC, src},
        {DNNL_ARG_WEIGHTS, weight(g_.constants.at(node.inputs[1]).f, w_user, pd.weights_desc())},
        {DNNL_ARG_DST, dst_view}};
    if (has_bias)
      args.emplace_back(DNNL_ARG_BIAS, weight(g_.constants.at(node.inputs[2]).f, bias_md, bias_md));
    add_primitive(dnnl::inner_product_forward(pd), std::move(args), node.describe(),
                  pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void conv(const Node& node) {
    if (node.has("kdflow_unrolled") || pointwise_on_channels_last(node)) return matrix_conv(node);
    const Shape& xs = g_.shape(node.inputs[0]);
    const Shape& ws = g_.shape(node.inputs[1]);
    const Shape& os = g_.shape(node.outputs[0]);
    if (!g_.is_constant(node.inputs[1]))
      throw InputError(fmt::format("{}: {}: weights must be constant", g_.file, node.describe()));
    const std::int64_t group = node.int_attr("group", 1);
    if (group > 1) kind_ = group == xs[1] && ws[0] == group ? "Conv (depthwise)" : "Conv (grouped)";
    const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
               pads = node.ints_attr("pads");
    const memory::dims strides = {s[0], s[1]}, dil = {d[0] - 1, d[1] - 1};
    const memory::dims pl = {pads[0], pads[1]}, pr = {pads[2], pads[3]};
    memory::dims wdims =
        group == 1 ? dims_of(ws) : memory::dims{group, ws[0] / group, ws[1], ws[2], ws[3]};
    const memory::desc w_user(wdims, dt::f32,
                              group == 1 ? memory::format_tag::oihw : memory::format_tag::goihw);
    const memory::desc any_src(dims_of(xs), act_, memory::format_tag::any);
    const memory::desc any_w(wdims, act_, memory::format_tag::any);
    const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
    const memory::desc bias_md({ws[0]}, dt::f32, memory::format_tag::a);
    const PostOp* sum = sum_post(node);
    const auto attr = attr_with(node);
    const auto make = [&](const memory::desc& dst_md) {
      return has_bias ? dnnl::convolution_forward::primitive_desc(
                            p_.eng, dnnl::prop_kind::forward_inference,
                            dnnl::algorithm::convolution_direct, any_src, any_w, bias_md, dst_md,
                            strides, dil, pl, pr, attr)
                      : dnnl::convolution_forward::primitive_desc(
                            p_.eng, dnnl::prop_kind::forward_inference,
                            dnnl::algorithm::convolution_direct, any_src, any_w, dst_md, strides,
                            dil, pl, pr, attr);
    };
    // Activations are channels-last (acdb) between convolutions: left to choose, neighbouring
    // convolutions pick different layouts (resnet18's 8x8 maps: aBcd16b beside acdb) and reorders
    // run inside the graph; channels-last also lets pointwise convolutions run as inner products
    // (matrix_conv). Where this CPU has no fast channels-last kernel for it (oneDNN falls back to
    // a reference or im2col-GEMM one), oneDNN chooses. With a residual sum the conv writes over the
    // other operand's buffer, in its layout.
    auto pd = make(sum ? at(sum->sum_input).md
                       : memory::desc(dims_of(os), act_, memory::format_tag::acdb));
    if (!sum) {
      const std::string impl = pd.impl_info_str();
      if (impl.starts_with("ref") || impl.starts_with("gemm:"))
        pd = make(memory::desc(dims_of(os), act_, memory::format_tag::any));
    }
    const ArgRef src = get(node.inputs[0], pd.src_desc());
    const ArgRef w = weight(g_.constants.at(node.inputs[1]).f, w_user, pd.weights_desc());
    const ArgRef dst = sum ? at(sum->sum_input) : new_buffer(pd.dst_desc());
    std::vector<std::pair<int, ArgRef>> args = {
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}};
    if (has_bias)
      args.emplace_back(DNNL_ARG_BIAS, weight(g_.constants.at(node.inputs[2]).f, bias_md, bias_md));
    add_primitive(dnnl::convolution_forward(pd), std::move(args), node.describe(),
                  pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void inner_product(const Node& node) {
    const bool gemm = node.op == "Gemm";
    if (gemm && node.int_attr("transA", 0))
      throw InputError(fmt::format("{}: {}: transA = 1 on a computed input is not supported",
                                   g_.file, node.describe()));
    const Shape& as = g_.shape(node.inputs[0]);
    const Shape& os = g_.shape(node.outputs[0]);
    const Tensor& b = g_.constants.at(node.inputs[1]);
    if (as.size() != 2) return matmul(node);
    const std::int64_t k = as[1], n = os[1];
    const bool tb = gemm && node.int_attr("transB", 0);
    const float alpha = gemm ? node.float_attr("alpha", 1) : 1.f,
                beta = gemm ? node.float_attr("beta", 1) : 1.f;
    std::vector<float> w(static_cast<std::size_t>(n * k)); // [n, k] = B^T unless transB
    for (std::int64_t o = 0; o < n; ++o)
      for (std::int64_t q = 0; q < k; ++q)
        w[static_cast<std::size_t>(o * k + q)] =
            alpha * b.f[static_cast<std::size_t>(tb ? o * k + q : q * n + o)];
    // Fed by a Flatten of a 4-D tensor: read that tensor in whatever layout it has.
    std::string src_value = node.inputs[0];
    Shape src_shape = as;
    if (const auto it = flat_source_.find(node.name); it != flat_source_.end()) {
      src_value = it->second;
      src_shape = g_.shape(src_value);
    }
    memory::dims wdims = src_shape.size() == 4
                             ? memory::dims{n, src_shape[1], src_shape[2], src_shape[3]}
                             : memory::dims{n, k};
    const memory::desc w_user(
        wdims, dt::f32, src_shape.size() == 4 ? memory::format_tag::oihw : memory::format_tag::oi);
    std::optional<std::vector<float>> bias;
    if (gemm && node.inputs.size() > 2 && !node.inputs[2].empty()) {
      const Tensor& c = g_.constants.count(node.inputs[2])
                            ? g_.constants.at(node.inputs[2])
                            : throw InputError(fmt::format("{}: {}: C must be constant", g_.file,
                                                           node.describe()));
      if (c.size() != n && c.size() != 1)
        throw InputError(fmt::format("{}: {}: C of shape {} is not a per-output bias", g_.file,
                                     node.describe(), format_shape(c.shape)));
      bias = std::vector<float>(static_cast<std::size_t>(n));
      for (std::int64_t o = 0; o < n; ++o)
        (*bias)[static_cast<std::size_t>(o)] =
            beta * static_cast<float>(c.at(c.size() == 1 ? 0 : o));
    }
    const memory::desc bias_md({n}, dt::f32, memory::format_tag::a);
    // The classifier head that writes the logits runs in fp32 even under bf16: it is a tiny share
    // of the work and keeps the logits' rounding to the rest of the network.
    const dt type = g_.is_output(node.outputs[0]) ? dt::f32 : act_;
    const memory::desc any_src(dims_of(src_shape), type, memory::format_tag::any);
    const memory::desc any_w(wdims, type, memory::format_tag::any);
    const memory::desc any_dst({os[0], n}, type, memory::format_tag::any);
    const auto attr = attr_with(node);
    const auto pd =
        bias ? dnnl::inner_product_forward::primitive_desc(p_.eng,
                                                           dnnl::prop_kind::forward_inference,
                                                           any_src, any_w, bias_md, any_dst, attr)
             : dnnl::inner_product_forward::primitive_desc(
                   p_.eng, dnnl::prop_kind::forward_inference, any_src, any_w, any_dst, attr);
    const ArgRef src = get(src_value, pd.src_desc());
    const ArgRef wref = weight(std::move(w), w_user, pd.weights_desc());
    const ArgRef dst = new_buffer(pd.dst_desc());
    std::vector<std::pair<int, ArgRef>> args = {
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wref}, {DNNL_ARG_DST, dst}};
    if (bias) args.emplace_back(DNNL_ARG_BIAS, weight(std::move(*bias), bias_md, bias_md));
    add_primitive(dnnl::inner_product_forward(pd), std::move(args), node.describe(),
                  pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void matmul(const Node& node) {
    if (node.op == "Gemm")
      throw InputError(
          fmt::format("{}: {}: Gemm with a computed B is not supported", g_.file, node.describe()));
    const Shape& os = g_.shape(node.outputs[0]);
    const auto padded = [&](Shape s) {
      while (s.size() < os.size()) s.insert(s.begin(), 1);
      return s;
    };
    const Shape as = padded(g_.shape(node.inputs[0])), bs = padded(g_.shape(node.inputs[1]));
    const memory::desc a_md = plain(as, act_), b_md = plain(bs, act_), dst_md = plain(os, act_);
    const auto pd = dnnl::matmul::primitive_desc(p_.eng, a_md, b_md, dst_md, attr_with(node));
    const auto operand = [&](const std::string& v, const memory::desc& md, const Shape& shape) {
      if (g_.is_constant(v)) {
        const ArgRef c = constant(v, shape);
        if (c.md == md) return c;
        std::vector<float> data = p_.weight_storage.back();
        return weight(std::move(data), c.md, md);
      }
      const ArgRef r = get_plain(v, act_);
      return ArgRef{r.kind, r.index, r.offset, md};
    };
    const ArgRef a = operand(node.inputs[0], a_md, as), b = operand(node.inputs[1], b_md, bs);
    const ArgRef dst = new_buffer(dst_md);
    add_primitive(dnnl::matmul(pd), {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, dst}},
                  node.describe(), pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void pool(const Node& node) {
    const Shape& xs = g_.shape(node.inputs[0]);
    const Shape& os = g_.shape(node.outputs[0]);
    const bool global = node.op == "GlobalAveragePool";
    const Shape k = global ? Shape{xs[2], xs[3]} : node.ints_attr("kernel_shape");
    const Shape s = global ? Shape{1, 1} : node.ints_attr("strides");
    const Shape d = global ? Shape{1, 1} : node.ints_attr("dilations", {1, 1});
    const Shape pads = global ? Shape{0, 0, 0, 0} : node.ints_attr("pads");
    memory::dims pr(2);
    bool overhang = false;
    for (int a = 0; a < 2; ++a) {
      const std::int64_t eff = (k[a] - 1) * d[a] + 1;
      pr[a] =
          std::max<std::int64_t>(pads[a + 2], (os[2 + a] - 1) * s[a] + eff - xs[2 + a] - pads[a]);
      overhang = overhang || pr[a] > pads[a + 2];
    }
    dnnl::algorithm alg = dnnl::algorithm::pooling_max;
    if (node.op != "MaxPool") {
      const bool include = node.int_attr("count_include_pad", 0) != 0;
      if (include && overhang)
        throw InputError(fmt::format(
            "{}: {}: count_include_pad with ceil_mode windows past the padding is not supported",
            g_.file, node.describe()));
      alg = include ? dnnl::algorithm::pooling_avg_include_padding
                    : dnnl::algorithm::pooling_avg_exclude_padding;
    }
    const memory::desc src_md = at(node.inputs[0]).md;
    const memory::desc dst_any(dims_of(os), src_md.get_data_type(), memory::format_tag::any);
    const auto pd = dnnl::pooling_forward::primitive_desc(
        p_.eng, dnnl::prop_kind::forward_inference, alg, src_md, dst_any, {s[0], s[1]},
        {k[0], k[1]}, {d[0] - 1, d[1] - 1}, {pads[0], pads[1]}, pr, plain_attr());
    const ArgRef src = get(node.inputs[0], pd.src_desc());
    const ArgRef dst = new_buffer(pd.dst_desc());
    add_primitive(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                  node.describe(), pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void reduce_mean(const Node& node) {
    const Shape& xs = g_.shape(node.inputs[0]);
    const auto axes = node.ints_attr("axes");
    Shape kept = xs;
    for (const auto a : axes) kept[static_cast<std::size_t>(a)] = 1;
    const ArgRef src = get_plain(node.inputs[0], act_);
    const memory::desc dst_md = plain(kept, act_);
    const auto pd = dnnl::reduction::primitive_desc(p_.eng, dnnl::algorithm::reduction_mean, src.md,
                                                    dst_md, 0.f, 0.f, plain_attr());
    const ArgRef dst = new_buffer(dst_md);
    add_primitive(dnnl::reduction(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}, node.describe(),
                  pd.scratchpad_desc());
    // keepdims = 0 is the same bytes seen with the reduced axes dropped.
    set(node.outputs[0],
        ArgRef{dst.kind, dst.index, dst.offset, plain(g_.shape(node.outputs[0]), act_)});
  }

  void eltwise(const Node& node) {
    const ArgRef& src = at(node.inputs[0]);
    const float alpha = node.op == "Clip" ? node.float_attr("min", 0) : node.float_attr("alpha", 0);
    const float beta = node.op == "Clip" ? node.float_attr("max", 0) : node.float_attr("beta", 0);
    const auto [a, b] = eltwise_params(node.op, alpha, beta);
    const auto pd = dnnl::eltwise_forward::primitive_desc(
        p_.eng, dnnl::prop_kind::forward_inference, eltwise_alg(node.op), src.md, src.md, a, b,
        plain_attr());
    const ArgRef in = src;
    const ArgRef dst = new_buffer(pd.dst_desc());
    add_primitive(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, dst}},
                  node.describe(), pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void binary(const Node& node) {
    const Shape& os = g_.shape(node.outputs[0]);
    std::string a = node.inputs[0], b = node.inputs[1];
    const bool commutative = node.op == "Add" || node.op == "Mul";
    // oneDNN broadcasts only the second operand: put the full-shape computed operand first.
    if (commutative && (g_.is_constant(a) || g_.shape(a) != os) && !g_.is_constant(b) &&
        g_.shape(b) == os)
      std::swap(a, b);
    const auto alg = node.op == "Add"   ? dnnl::algorithm::binary_add
                     : node.op == "Sub" ? dnnl::algorithm::binary_sub
                     : node.op == "Mul" ? dnnl::algorithm::binary_mul
                                        : dnnl::algorithm::binary_div;
    const auto padded = [&](Shape s) {
      while (s.size() < os.size()) s.insert(s.begin(), 1);
      return s;
    };
    if (g_.is_constant(a) || g_.shape(a) != os) { // first operand broadcasts: plain kernel
      const Shape as = g_.shape(a), bs = g_.shape(b);
      const ArgRef ra = g_.is_constant(a) ? constant(a, as) : get_plain(a, dt::f32);
      const ArgRef rb = g_.is_constant(b) ? constant(b, bs) : get_plain(b, dt::f32);
      const ArgRef dst = new_buffer(plain(os, dt::f32));
      const std::string op = node.op;
      add_kernel(
          [op, as, bs, os](std::byte* const* p) {
            ref::binary(op, reinterpret_cast<const float*>(p[0]), as,
                        reinterpret_cast<const float*>(p[1]), bs, reinterpret_cast<float*>(p[2]),
                        os);
          },
          {ra, rb, dst}, node.describe());
      set(node.outputs[0], dst);
      return;
    }
    const ArgRef src0 = at(a);
    const Shape bs = padded(g_.shape(b));
    ArgRef src1;
    if (g_.is_constant(b)) {
      src1 = constant(b, bs);
    } else if (g_.shape(b) == os) {
      src1 = at(b);
    } else {
      const ArgRef r = get_plain(b, act_);
      src1 = ArgRef{r.kind, r.index, r.offset, plain(bs, act_)};
    }
    const auto pd =
        dnnl::binary::primitive_desc(p_.eng, alg, src0.md, src1.md, src0.md, plain_attr());
    const ArgRef dst = new_buffer(pd.dst_desc());
    add_primitive(dnnl::binary(pd),
                  {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1}, {DNNL_ARG_DST, dst}},
                  node.describe(), pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void concat(const Node& node) {
    std::vector<memory::desc> mds;
    std::vector<ArgRef> srcs;
    for (const auto& in : node.inputs) {
      srcs.push_back(g_.is_constant(in) ? constant(in, g_.shape(in)) : at(in));
      mds.push_back(srcs.back().md);
    }
    const dt type = mds[0].get_data_type();
    for (std::size_t k = 0; k < srcs.size(); ++k)
      if (mds[k].get_data_type() != type) { // one element type for all: convert the odd ones
        srcs[k] = g_.is_constant(node.inputs[k]) ? srcs[k] : get_plain(node.inputs[k], type);
        mds[k] = srcs[k].md;
      }
    const auto pd = dnnl::concat::primitive_desc(p_.eng, static_cast<int>(node.int_attr("axis", 0)),
                                                 mds, plain_attr());
    const ArgRef dst = new_buffer(pd.dst_desc());
    std::vector<std::pair<int, ArgRef>> args = {{DNNL_ARG_DST, dst}};
    for (std::size_t k = 0; k < srcs.size(); ++k)
      args.emplace_back(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(k), srcs[k]);
    add_primitive(dnnl::concat(pd), std::move(args), node.describe(), pd.scratchpad_desc());
    set(node.outputs[0], dst);
  }

  void reshape(const Node& node) {
    const ArgRef& cur = at(node.inputs[0]);
    const dt type = cur.md.get_data_type();
    const ArgRef src = get_plain(node.inputs[0], type);
    set(node.outputs[0],
        ArgRef{src.kind, src.index, src.offset, plain(g_.shape(node.outputs[0]), type)});
  }

  void transpose(const Node& node) {
    const dt type = at(node.inputs[0]).md.get_data_type();
    const ArgRef src = get_plain(node.inputs[0], type);
    const auto perm = node.ints_attr("perm");
    std::vector<int> inverse(perm.size());
    for (std::size_t k = 0; k < perm.size(); ++k)
      inverse[static_cast<std::size_t>(perm[k])] = static_cast<int>(k);
    const memory::desc permuted = src.md.permute_axes(inverse);
    const ArgRef dst = new_buffer(plain(g_.shape(node.outputs[0]), type));
    add_reorder(ArgRef{src.kind, src.index, src.offset, permuted}, dst, node.describe());
    set(node.outputs[0], dst);
  }

  void slice(const Node& node) {
    const Shape& xs = g_.shape(node.inputs[0]);
    std::vector<std::int64_t> in_strides(xs.size(), 1);
    for (std::size_t d = xs.size(); d-- > 1;) in_strides[d - 1] = in_strides[d] * xs[d];
    std::int64_t split_offset = 0;
    for (std::size_t out = 0; out < node.outputs.size(); ++out) {
      std::vector<std::int64_t> start(xs.size(), 0), step(xs.size(), 1);
      if (node.op == "Slice") {
        start = node.ints_attr("starts_full");
        step = node.ints_attr("steps_full");
      } else {
        start[static_cast<std::size_t>(node.int_attr("axis", 0))] = split_offset;
        split_offset += node.ints_attr("split")[out];
      }
      const Shape& os = g_.shape(node.outputs[out]);
      const bool negative = std::any_of(step.begin(), step.end(), [](auto v) { return v < 0; });
      if (negative) {
        const ArgRef src = get_plain(node.inputs[0], dt::f32);
        const ArgRef dst = new_buffer(plain(os, dt::f32));
        add_kernel(
            [xs, os, start, step](std::byte* const* p) {
              ref::slice(reinterpret_cast<const float*>(p[0]), xs, reinterpret_cast<float*>(p[1]),
                         os, start, step);
            },
            {src, dst}, node.describe());
        set(node.outputs[out], dst);
        continue;
      }
      const dt type = at(node.inputs[0]).md.get_data_type();
      const ArgRef src = get_plain(node.inputs[0], type);
      memory::dims strides(xs.size());
      std::int64_t offset = 0;
      for (std::size_t d = 0; d < xs.size(); ++d) {
        strides[d] = in_strides[d] * step[d];
        offset += start[d] * in_strides[d];
      }
      const memory::desc view(dims_of(os), type, strides);
      const ArgRef dst = new_buffer(plain(os, type));
      add_reorder(
          ArgRef{src.kind, src.index,
                 src.offset + static_cast<std::size_t>(offset) * memory::data_type_size(type),
                 view},
          dst, node.describe());
      set(node.outputs[out], dst);
    }
  }

  void pad(const Node& node) {
    const Shape xs = g_.shape(node.inputs[0]), os = g_.shape(node.outputs[0]);
    const ArgRef src = get_plain(node.inputs[0], dt::f32);
    const ArgRef dst = new_buffer(plain(os, dt::f32));
    const auto pads = node.ints_attr("pads");
    const std::string mode = node.string_attr("mode", "constant");
    const float value = node.float_attr("value", 0);
    add_kernel(
        [xs, os, pads, mode, value](std::byte* const* p) {
          ref::pad(reinterpret_cast<const float*>(p[0]), xs, reinterpret_cast<float*>(p[1]), os,
                   pads, mode, value);
        },
        {src, dst}, node.describe());
    set(node.outputs[0], dst);
  }

  void softmax(const Node& node) {
    const Shape& xs = g_.shape(node.inputs[0]);
    auto axis = static_cast<int>(node.int_attr("axis", 1));
    const dt type = at(node.inputs[0]).md.get_data_type();
    ArgRef src = get_plain(node.inputs[0], type);
    if (node.int_attr("coerce_2d", 0) && static_cast<std::size_t>(axis) + 1 < xs.size()) {
      std::int64_t outer = 1, inner = 1;
      for (std::size_t d = 0; d < xs.size(); ++d)
        (d < static_cast<std::size_t>(axis) ? outer : inner) *= xs[d];
      src.md = plain({outer, inner}, type);
      axis = 1;
    }
    const auto pd = dnnl::softmax_forward::primitive_desc(
        p_.eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, src.md,
        src.md, axis, plain_attr());
    const ArgRef dst = new_buffer(src.md);
    add_primitive(dnnl::softmax_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                  node.describe(), pd.scratchpad_desc());
    set(node.outputs[0], ArgRef{dst.kind, dst.index, dst.offset, plain(xs, type)});
  }

  Teacher::Plan& p_;
  Graph& g_;
  dt act_;
  std::map<std::string, ArgRef> loc_;
  std::vector<std::pair<std::string, ArgRef>> converted_;
  std::set<std::string> skipped_;
  std::map<std::string, std::string> flat_source_;
  std::string kind_; // StepInfo::kind of the steps the current node adds
};

} // namespace

std::shared_ptr<const Teacher> Teacher::load(const std::string& path,
                                             const TeacherOptions& options) {
  if (options.batch < 1)
    throw InputError(fmt::format("teacher batch {} must be at least 1", options.batch));
  // Refused, not emulated: oneDNN has no bf16 kernels below AVX512_BF16 for most primitives (the
  // build fails deep inside a primitive descriptor), and where it emulates them it is slower than
  // fp32, which defeats the point of asking for bf16.
  if (options.precision == Precision::bf16 && !has_native_bf16())
    throw InputError(fmt::format(
        "{}: teacher.precision = bf16 needs a CPU with AVX512_BF16 or AMX, and this one runs "
        "oneDNN's {} ISA; use fp32 (teacher.precision = fp32, or --precision fp32)",
        path, onednn_info().isa));
  std::shared_ptr<Teacher> t(new Teacher());
  t->plan_ = std::make_unique<Plan>();
  LoadOptions lo;
  lo.batch = options.batch;
  lo.sample_shape = options.sample_shape;
  t->plan_->graph = load_onnx(path, lo);
  t->plan_->precision = options.precision;
  Builder(*t->plan_).build(options.features);
  return t;
}

Teacher::~Teacher() = default;
const Graph& Teacher::graph() const { return plan_->graph; }
Precision Teacher::precision() const { return plan_->precision; }
std::int64_t Teacher::batch() const { return plan_->graph.batch; }
Shape Teacher::input_shape() const { return plan_->graph.input_shape; }
std::vector<std::string> Teacher::output_names() const {
  std::vector<std::string> out;
  for (const auto& o : plan_->outputs) out.push_back(o.name);
  return out;
}
Shape Teacher::output_shape(std::size_t k) const { return plan_->outputs.at(k).shape; }
std::size_t Teacher::steps() const { return plan_->steps.size(); }
std::size_t Teacher::reorders() const {
  return static_cast<std::size_t>(std::count_if(plan_->steps.begin(), plan_->steps.end(),
                                                [](const Step& s) { return s.reorder; }));
}

std::vector<StepInfo> Teacher::step_info() const {
  std::vector<StepInfo> out;
  for (const auto& s : plan_->steps)
    out.push_back({s.label, s.kind, s.prim ? impl_of(*s.prim) : "plain kernel"});
  return out;
}

// --- replicas ------------------------------------------------------------------------------------

struct Replica::State {
  struct AlignedFree {
    void operator()(std::byte* p) const { std::free(p); }
  };
  dnnl::stream stream;
  std::vector<std::unique_ptr<std::byte, AlignedFree>> buffers;
  std::unique_ptr<std::byte, AlignedFree> scratch;
  memory input;                                            // handle set per run
  std::vector<std::pair<memory, std::size_t>> input_views; // other views of the input, by offset
  std::vector<memory> outputs;                             // handles set per run
  std::vector<std::unordered_map<int, memory>> args;       // per primitive step
  std::vector<std::vector<std::byte*>>
      kernel_ptrs; // per kernel step (input/output patched per run)
  std::vector<std::vector<std::pair<std::size_t, ArgRef>>> kernel_user_args;
  const float* current_input = nullptr;
  std::span<float* const> current_outputs;
};

namespace {

std::byte* aligned_bytes(std::size_t n) {
  constexpr std::size_t kAlign = 64;
  void* p =
      std::aligned_alloc(kAlign, std::max<std::size_t>(kAlign, (n + kAlign - 1) / kAlign * kAlign));
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

} // namespace

Replica::Replica(std::shared_ptr<const Teacher> teacher)
    : teacher_(std::move(teacher)), state_(std::make_unique<State>()) {
  const Teacher::Plan& p = teacher_->plan();
  State& s = *state_;
  s.stream = dnnl::stream(p.eng);
  for (const auto bytes : p.buffer_bytes) s.buffers.emplace_back(aligned_bytes(bytes));
  s.scratch.reset(aligned_bytes(p.scratchpad_bytes));
  s.input = memory(p.input_md, p.eng, DNNL_MEMORY_NONE);
  for (const auto& o : p.outputs) s.outputs.push_back(memory(o.md, p.eng, DNNL_MEMORY_NONE));
  const memory scratch(
      memory::desc({static_cast<memory::dim>(p.scratchpad_bytes)}, dt::u8, memory::format_tag::a),
      p.eng, s.scratch.get());

  const auto resolve = [&](const ArgRef& r) -> memory {
    switch (r.kind) {
    case ArgRef::Kind::weight: return p.weights[static_cast<std::size_t>(r.index)];
    case ArgRef::Kind::input: {
      if (r.md == p.input_md && r.offset == 0) return s.input;
      s.input_views.emplace_back(memory(r.md, p.eng, DNNL_MEMORY_NONE), r.offset);
      return s.input_views.back().first;
    }
    case ArgRef::Kind::output: return s.outputs[static_cast<std::size_t>(r.index)];
    case ArgRef::Kind::buffer:
      return memory(r.md, p.eng, s.buffers[static_cast<std::size_t>(r.index)].get() + r.offset);
    }
    throw std::logic_error("bad operand");
  };
  for (const auto& step : p.steps) {
    std::unordered_map<int, memory> args;
    std::vector<std::byte*> ptrs;
    std::vector<std::pair<std::size_t, ArgRef>> user;
    if (step.prim) {
      for (const auto& [arg, ref] : step.args) args.emplace(arg, resolve(ref));
      args.emplace(DNNL_ARG_SCRATCHPAD, scratch);
    } else {
      for (std::size_t k = 0; k < step.args.size(); ++k) {
        const ArgRef& ref = step.args[k].second;
        if (ref.kind == ArgRef::Kind::buffer)
          ptrs.push_back(s.buffers[static_cast<std::size_t>(ref.index)].get() + ref.offset);
        else if (ref.kind == ArgRef::Kind::weight)
          ptrs.push_back(static_cast<std::byte*>(
              p.weights[static_cast<std::size_t>(ref.index)].get_data_handle()));
        else {
          ptrs.push_back(nullptr);
          user.emplace_back(k, ref);
        }
      }
    }
    s.args.push_back(std::move(args));
    s.kernel_ptrs.push_back(std::move(ptrs));
    s.kernel_user_args.push_back(std::move(user));
  }
}

Replica::~Replica() = default;

void Replica::run(const float* input, std::span<float* const> outputs) {
  execute(input, outputs, {});
}

void Replica::run_timed(const float* input, std::span<float* const> outputs,
                        std::span<double> step_seconds) {
  if (step_seconds.size() != teacher_->steps())
    throw std::invalid_argument(fmt::format("teacher: {} step times given, {} steps to time",
                                            step_seconds.size(), teacher_->steps()));
  execute(input, outputs, step_seconds);
}

void Replica::execute(const float* input, std::span<float* const> outputs,
                      std::span<double> step_seconds) {
  const Teacher::Plan& p = teacher_->plan();
  State& s = *state_;
  const bool timed = !step_seconds.empty();
  if (outputs.size() != p.outputs.size())
    throw std::invalid_argument(fmt::format("teacher: {} output buffers given, {} expected",
                                            outputs.size(), p.outputs.size()));
  s.input.set_data_handle(const_cast<float*>(input));
  for (auto& [view, offset] : s.input_views)
    view.set_data_handle(reinterpret_cast<std::byte*>(const_cast<float*>(input)) + offset);
  for (std::size_t k = 0; k < outputs.size(); ++k) s.outputs[k].set_data_handle(outputs[k]);
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const Step& step = p.steps[i];
    const auto start =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const auto done = [&] {
      if (!timed) return;
      s.stream.wait();
      step_seconds[i] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    if (step.prim) {
      step.prim->execute(s.stream, s.args[i]);
      done();
      continue;
    }
    s.stream.wait(); // plain kernels run on this thread, after the primitives before them
    auto& ptrs = s.kernel_ptrs[i];
    for (const auto& [k, ref] : s.kernel_user_args[i])
      ptrs[k] = ref.kind == ArgRef::Kind::input
                    ? reinterpret_cast<std::byte*>(const_cast<float*>(input)) + ref.offset
                    : reinterpret_cast<std::byte*>(outputs[static_cast<std::size_t>(ref.index)]) +
                          ref.offset;
    step.kernel(ptrs.data());
    done();
  }
  s.stream.wait();
}

} // namespace kdflow::teacher
