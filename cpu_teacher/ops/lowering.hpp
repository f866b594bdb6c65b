// The execution plan's builder as op lowerings see it (internal, oneDNN-level): where each value
// lives, buffers, weights reordered once at load, and the steps a node adds. engine.cpp drives it
// node by node through the op table; each op's LowerFn (ops/*.cpp) uses this interface.
#pragma once

#include "kdflow/cpu_teacher/engine.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kdflow::teacher {

using dnnl::memory;
using dt = memory::data_type;

// Where a step's operand lives. Buffers are per replica; weights are shared by all replicas.
struct ArgRef {
  enum class Kind { buffer, weight, input, output } kind = Kind::buffer;
  int index = 0;          // buffer, weight or output number
  std::size_t offset = 0; // bytes into the buffer (views: slices, splits)
  memory::desc md;
};

// A plain kernel for op variants without a primitive; it gets one pointer per operand.
using Kernel = std::function<void(std::byte* const* ptrs)>;

// How a plain kernel walks its data, for profiles (StepInfo::impl): by rows or blocks (contiguous
// inner loops the compiler vectorizes, copies, fills), or element by element with each element's
// offsets computed from its index, the reference's own loop (kept for rare variants: reflect and
// edge padding, negative steps, broadcasts without rows).
enum class KernelLoop { rows, reference };

struct Step {
  std::optional<dnnl::primitive> prim;
  Kernel kernel;
  std::vector<std::pair<int, ArgRef>> args; // (DNNL_ARG_*, operand); kernels: positional
  std::string label;
  std::string kind; // StepInfo::kind
  std::string node; // the node whose lowering added it (reorders included); "" for the outputs'
  bool reorder = false;
  // A reorder of a value into the layout or type a reader asked for: that value and the node
  // whose lowering wrote it (Plan::written; both "" for reorders that are an op's own work, a
  // transpose's copy, say; the producer "" for the network's input). The tuner weighs that node's
  // other ways against it.
  std::string value, producer;
  KernelLoop loop = KernelLoop::rows; // kernels
  std::string impl; // a kernel that is more than a plain loop (StepInfo::impl); "" for the rest
  int weight_levels = 0;     // StepInfo::weight_levels
  bool weight_pairs = false; // StepInfo::weight_pairs
};

// A node that can run more than one way (a convolution: direct channels-last, direct in the
// layout oneDNN prefers, as an inner product, unrolled): the ways it offers, in the order the
// untuned plan prefers them, and the one this plan runs.
struct NodeOptions {
  std::string node;
  std::vector<std::string> options;
  std::string chosen;
  std::string takes_in; // the node the chosen way lowered with this one (Lowering::skip), or ""
};

// How an int8 product's weights are quantized (quantize_rows): each row rounded to
// [-levels, levels] steps of its own scale;
// - with `pair_taps` > 0 also every pair of one sign that a kernel without int8 dot products may
//   sum in 16 bits held within levels + 1 together: the weights of neighbouring input channels at
//   one tap, each row laid out as [input channel][pair_taps taps];
// - `doubled`: handed to oneDNN as even integers at half the scale, for a kernel that halves its
//   weights itself while reordering them, which then stores the integers chosen here.
struct WeightQuant {
  int levels;
  bool doubled = false;
  int pair_taps = 0;
};

// The int8 calibration cache (tune.cpp): the ranges kept under `key` in the plan cache's folder,
// or nullopt (no folder, no file, another key, a damaged file); and the ranges written there
// (whole or not at all; `c.cache_file` or `c.note` says which).
std::optional<Calibration> read_calibration_cache(const TeacherOptions& options,
                                                  const std::string& key);
void write_calibration_cache(const TeacherOptions& options, const std::string& key, Calibration& c);
// The digest of a calibration's ranges (Calibration::digest).
std::uint64_t ranges_digest(const Calibration& c);

// The threads each replica runs a plan with: TeacherOptions::threads, or the calling thread's
// arena's where that is 0.
int replica_threads(const TeacherOptions& options);

// Each node's first way from `prefer` that it offers (nodes offering none are left out: they run
// their first way).
std::map<std::string, std::string> prefer_ways(const std::vector<NodeOptions>& nodes,
                                               const std::vector<std::string>& prefer);

struct Teacher::Plan {
  Graph graph;
  Precision precision = Precision::fp32;
  std::shared_ptr<const Calibration> calibration; // int8's ranges
  std::optional<LogitAgreement> int8_check;       // Teacher::load_int8
  // Calibration plans (fp32): each quantizable product's input is observed by a step that widens
  // its (min, max) in `observed`, value by value as `observed_values` names them.
  bool observe = false;
  std::vector<std::string> observed_values;
  std::shared_ptr<std::vector<std::pair<float, float>>> observed;
  // What the tuner (or a cache) chose, node by node; a node not named takes its first option.
  std::map<std::string, std::string> choices;
  std::vector<NodeOptions> options; // filled while lowering: every node with a choice
  // Each value's writer (the node whose lowering set it; "" for the network's input) and the
  // layout and type it was set in, as lowered: the tuner reads which way writes what a reader asks.
  struct Written {
    std::string node;
    memory::desc md;
  };
  std::map<std::string, Written> written;
  // The nodes each node's lowering took in (Lowering::skip: a depthwise convolution run as the
  // pointwise one's post-op, say): their work is in that node's steps.
  std::map<std::string, std::vector<std::string>> taken_in;
  TuneReport tune;
  int threads = 1; // each replica's threads (TeacherOptions::threads, or the arena's)
  // Passes of the batch (graph.chunks) run at once, each on one thread of its own: the plan is
  // built for one thread, and a replica holds this many lanes, each its own buffers
  // (TeacherOptions::passes_at_once). 1: one pass at a time, on all of `threads`.
  int passes_at_once = 1;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::vector<std::size_t> buffer_bytes;
  std::vector<std::size_t> buffer_offset; // each buffer's place in a replica's block of arena_bytes
  std::size_t arena_bytes = 0;
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

inline memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

// Row-major layout of `s`.
inline memory::desc plain(const Shape& s, dt type) {
  memory::dims strides(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) strides[d - 1] = strides[d] * s[d];
  return memory::desc(dims_of(s), type, strides);
}

class Lowering {
public:
  explicit Lowering(Teacher::Plan& plan);

  // Lowers every node through the op table, then reorders the outputs (and `features`) into
  // plain float32.
  void build(const std::vector<std::string>& features);

  // --- for op lowerings ------------------------------------------------------------------------
  [[nodiscard]] const Graph& graph() const { return g_; }
  [[nodiscard]] const dnnl::engine& eng() const { return p_.eng; }
  // The threads each replica runs the plan with.
  [[nodiscard]] int threads() const { return p_.threads; }
  // The element type products (Conv, Gemm, MatMul, Einsum) read: f32, or bf16 under
  // teacher.precision = bf16.
  [[nodiscard]] dt act() const { return act_; }
  // The element type `value` is written in: act(), but f32 where PyTorch's CPU autocast keeps it
  // in fp32 under bf16 (see find_wide_values).
  [[nodiscard]] dt type_of(const std::string& value) const {
    return wide_.count(value) != 0 ? dt::f32 : act_;
  }
  // teacher.precision = int8: how a product reads `value`, quantized with one scale (u8 where
  // its calibrated range is non-negative, s8 elsewhere; value = scale * integer), or nullopt
  // where it reads act() (another precision, or a value without a range).
  struct Quant {
    dt type;
    float scale;
    friend bool operator==(const Quant&, const Quant&) = default;
  };
  [[nodiscard]] std::optional<Quant> quant_of(const std::string& value) const;
  // The value a product reads as its input (a Gemm fed by a flattening view reads the 4-D tensor
  // before it), and whether int8 quantizes the product: a 2-D convolution with constant weights,
  // or a Gemm/MatMul of a 2-D A and a constant 2-D B (the linear layers of transformers and
  // ConvNeXts, which the passes make Gemms over A's rows) that does not write a graph output (the
  // classifier head stays f32, as under bf16).
  [[nodiscard]] const std::string& product_input(const Node& node) const;
  [[nodiscard]] bool quantizable(const Node& node) const;
  // quant_of(product_input(node)) where the node is quantizable, else nullopt.
  [[nodiscard]] std::optional<Quant> quant_input(const Node& node) const;
  // The quantization a quantized product writes its output in, when every reader of it is a
  // product that reads it quantized (the readers' input scale applied as the writer's output
  // scale, so no f32 tensor or quantizing reorder sits between them); nullopt: it writes f32.
  // A convolution with a residual sum writes so too when its summand was written quantized (in
  // the same type): the residual stream stays u8/s8 from block to block (ResNets, MobileNets),
  // the summand read at its own scale (the sum post-op's scale) and overwritten at the output's.
  [[nodiscard]] std::optional<Quant> quantized_output(const Node& node) const;
  // How `value` is stored when a quantized product writes it: the one quantization every reader
  // takes it in (a quantized product's input, the summand of a convolution that writes quantized
  // in turn, a MaxPool's input where its output is stored so; a value only sums read: its own
  // calibrated range), or nullopt where some reader needs it in f32.
  [[nodiscard]] std::optional<Quant> stored_quant(const std::string& value) const;
  // `value` quantized with `q` in layout `want` (of q.type): one reorder applying the scale,
  // made once and shared by every product reading it so (a layout change only, where a
  // convolution wrote it quantized already).
  ArgRef get_quantized(const std::string& value, const memory::desc& want, const Quant& q);
  // Constant f32 values a primitive reads as runtime scales (DNNL_ARG_ATTR_SCALES | arg).
  ArgRef scales(std::vector<float> values);
  // A quantized product's runtime scales: reading `q` (one source scale, and the weights' one per
  // output channel: `weights_mask`, oneDNN's mask of that axis in its weights' layout), writing
  // `q_out` where it writes quantized. The masks go on `attr` before the primitive is made, the
  // values (`weight_scales` from quantize_weights) into its `args` after.
  static void set_quant_masks(dnnl::primitive_attr& attr, const std::optional<Quant>& q,
                              const std::optional<Quant>& q_out, int weights_mask);
  void add_quant_scales(std::vector<std::pair<int, ArgRef>>& args, const std::optional<Quant>& q,
                        std::vector<float> weight_scales, const std::optional<Quant>& q_out);
  // An InputError "<file>: <node>: <what>".
  [[noreturn]] void fail(const Node& node, const std::string& what) const;
  // StepInfo::kind of the steps the node adds from now on (its op type unless refined).
  void set_kind(std::string kind) { kind_ = std::move(kind); }
  // int8: weights `w` of `rows` output rows quantized per row as `wq` says (quantize_rows), `wq`
  // kept as StepInfo::weight_levels and weight_pairs of the primitive the node adds next.
  std::pair<std::vector<float>, std::vector<float>>
  quantize_weights(const std::vector<float>& w, std::int64_t rows,
                   WeightQuant wq = {int8_weight_levels()});
  // Which of `options` (the untuned plan's preference first) the node runs: the plan's choice
  // for it when that is one of them, else the first. Recorded for the tuner and `--plan`.
  std::string choose(const Node& node, std::vector<std::string> options);

  // Whether this lowering records value ranges for int8's calibration (every product's input
  // must then be a buffer of its own).
  [[nodiscard]] bool observing() const { return p_.observe; }
  // Whether `value` is returned as a feature (it must then be a buffer of its own).
  [[nodiscard]] bool is_feature(const std::string& value) const {
    return features_.count(value) != 0;
  }
  // Node `name`, later in the graph, is lowered already (fused into the node lowering now): the
  // tuner learns that the node's chosen way took it in.
  void skip(const std::string& name);

  // Where `value` lives now; a logic_error if nothing computed it yet. A value a shape op left as
  // a view (below) is first copied into a plain buffer of its own (once, by a reorder added now):
  // what at() returns is dense, and any op may read or overwrite it.
  const ArgRef& at(const std::string& value);
  // Where `value` lives, for a reader that takes any dense strided layout of the value's own axes
  // (oneDNN's binary): a view that is one (a transpose's permuted strides over its input's bytes)
  // is read in place, where at() would copy it out plain; any other view is at()'s.
  const ArgRef& dense(const std::string& value);
  // Where `value` lives, a view as it is kept (its md may have more axes than the value: for
  // checks of a layout, which a view then matches none of).
  [[nodiscard]] const ArgRef& view_at(const std::string& value) const;
  [[nodiscard]] bool is_view(const std::string& value) const { return views_.count(value) != 0; }
  // Where `value` lies, seen as a plain strided layout of its own axes read in place (a view whose
  // fine axes nest within each of the value's axes: attention's Q, K and V selected from one
  // projection, K transposed), or nullopt where it does not lie so (a blocked layout, or a view
  // whose fine axes do not nest).
  [[nodiscard]] std::optional<ArgRef> strided(const std::string& value) const;
  // `value` in layout `want`, reordered once (and cached) when it lives in another layout; a view
  // lying as wanted is read in place, else reordered straight into `want` where that is plain
  // strided or the view has the value's own axes. For readers only: an op that writes over what
  // it reads calls before_overwrite first.
  ArgRef get(const std::string& value, const memory::desc& want);
  ArgRef get_plain(const std::string& value, dt type) {
    return get(value, plain(g_.shape(value), type));
  }
  // One reorder of `value` (a view read through its strides, or its buffer as it lies) into
  // `dst`: a plain strided layout of the value's shape over a window of another buffer (a
  // Concat's slice). A view whose fine axes cannot be seen in dst's strides is copied out plain
  // first (at()).
  void reorder_into(const std::string& value, const ArgRef& dst);
  void set(const std::string& value, ArgRef ref);

  // Views. A shape op may leave its output as a view of its input's bytes (in a plain strided
  // layout, or a view) instead of copying them: its readers copy it out once, straight into the
  // layout they want (or read it in place where it lies so), so a chain of transposes, reshapes,
  // selections and splits (attention's Q, K and V taken from one projection, ShuffleNet's channel
  // shuffle) costs one reorder, not one per op. A view is kept as strided axes, finer than the
  // value's own where a reshape merges axes that do not lie one inside the other (attention's
  // [seq, batch, heads * dim] seen as [seq, batch * heads, dim]): each of the value's axes is a
  // run of them. Each call makes node.outputs[0] a view of node.inputs[0], or returns false (the
  // op then copies): for a graph output, a feature or a calibration plan (those need buffers of
  // their own), for the network input or a blocked layout, and where strides cannot say it.
  bool view_permuted(const Node& node, const std::vector<std::int64_t>& perm);
  bool view_reshaped(const Node& node);
  // One index along `axis`, the axis replaced by `index_rank` axes of size 1.
  bool view_selected(const Node& node, std::size_t axis, std::int64_t index,
                     std::size_t index_rank);
  // Indices (non-negative, of `index_shape`) along `axis` that step evenly along each of their
  // axes (an exporter's as_strided: a Gather of a flattened tensor at constant positions).
  bool view_gathered(const Node& node, std::size_t axis, const std::vector<std::int64_t>& indices,
                     const Shape& index_shape);
  // Output `k` of a Split or Slice: the window of `start` and `step` on each axis.
  bool view_window(const Node& node, std::size_t k, const std::vector<std::int64_t>& start,
                   const std::vector<std::int64_t>& step);
  // `value`'s buffer is about to be overwritten in place (a residual sum accumulated into its
  // summand): every view of that buffer still unread is copied out first.
  void before_overwrite(const std::string& value);
  ArgRef new_buffer(const memory::desc& md);
  // A constant in the layout a primitive asked for, reordered once at load.
  ArgRef weight(std::vector<float> data, const memory::desc& user_md, const memory::desc& want);
  // Constant `name` as plain float32 of `as_shape`, reordered to `want` when given.
  ArgRef constant(const std::string& name, const Shape& as_shape,
                  const std::optional<memory::desc>& want = std::nullopt);

  // `value`: the value converted for a reader (Step::producer is the node that wrote it), "" for
  // a reorder that is an op's own work.
  void add_reorder(const ArgRef& src, const ArgRef& dst, const std::string& label,
                   const std::string& value = {});
  void add_primitive(dnnl::primitive prim, std::vector<std::pair<int, ArgRef>> args,
                     const std::string& label, const memory::desc& scratchpad);
  // `impl`: what runs it where that is more than kdflow's plain loop (a kernel that calls oneDNN
  // primitives itself), for profiles; the label then is the node's alone.
  void add_kernel(Kernel k, std::vector<ArgRef> operands, const std::string& label,
                  KernelLoop loop = KernelLoop::rows, std::string impl = {});

  // A user scratchpad and the node's fused post-ops (eltwise activations, residual sum), after a
  // scaling by `scale` when it is not 1.
  // (`sum_scale`, `sum_type`: the residual summand's own scale and type where it is read
  // quantized; its type may differ from the output's in sign only, u8 against s8.)
  [[nodiscard]] dnnl::primitive_attr attr_with(const Node& node, float scale = 1.f,
                                               float sum_scale = 1.f,
                                               dt sum_type = dt::undef) const;
  // attr_with(pointwise) with a depthwise convolution fused after its post-ops (oneDNN's
  // depthwise post-op: a 3x3 kernel of `stride`, padding 1, weights of `weights` type, an f32
  // bias, writing `dst`), then the depthwise node's own eltwise post-ops.
  [[nodiscard]] dnnl::primitive_attr attr_with_depthwise(const Node& pointwise,
                                                         const Node& depthwise, dt weights, dt dst,
                                                         int stride) const;
  // A user scratchpad, no post-ops.
  [[nodiscard]] static dnnl::primitive_attr plain_attr();
  [[nodiscard]] static const PostOp* sum_post(const Node& node);
  // Whether a kdflow kernel step (Winograd, im2col) may lower convolution `node`, writing its
  // output channels-last in act(): constant weights and bias, f32 or bf16 activations (not int8,
  // nor its calibration plan, which observes every product's input), the output in act(), and a
  // residual summand, if any, lying channels-last in act() too.
  [[nodiscard]] bool conv_into_channels_last(const Node& node) const;
  // The 4-D tensor a Gemm/MatMul reads directly in place of the flattening view before it,
  // or nullptr (see find_flatten_into_gemm).
  [[nodiscard]] const std::string* flat_source(const Node& node) const;

private:
  void find_flatten_into_gemm();
  void find_wide_values();
  void add_node(const Node& node);
  void append_post_ops(dnnl::post_ops& ops, const Node& node, float sum_scale,
                       dt sum_type = dt::undef) const;
  void observe(const std::string& value);
  // quantized_output's and stored_quant's answers, worked out (they keep them).
  [[nodiscard]] std::optional<Quant> written_quant(const Node& node) const;
  [[nodiscard]] std::optional<Quant> readers_quant(const std::string& value) const;

  Teacher::Plan& p_;
  const Graph& g_;
  dt act_;
  std::map<std::string, ArgRef> loc_;
  // A view's strided axes (outermost first) and how many of them make each of the value's axes.
  struct Fine {
    std::vector<std::int64_t> size, stride;
    std::vector<int> group;
  };
  [[nodiscard]] bool may_view(const Node& node, std::size_t k = 0) const;
  [[nodiscard]] Fine fine_of(const std::string& value) const;
  // `want` (a plain strided layout of view `value`'s shape) over the view's fine axes, or nullopt.
  [[nodiscard]] std::optional<memory::desc> in_fine_axes(const std::string& value,
                                                         const memory::desc& want) const;
  bool set_fine(const Node& node, std::size_t offset, Fine f, std::size_t k = 0);
  std::map<std::string, std::vector<int>> views_; // the views: Fine::group of each
  std::vector<std::pair<std::string, ArgRef>> converted_;
  std::set<std::string> skipped_;
  std::set<std::string> features_;
  std::set<std::string> wide_; // the values kept in f32 under bf16
  std::map<std::string, std::string> flat_source_;
  // stored_quant by value and quantized_output by the node's output: both walk the graph (readers
  // forward, residual summands back), and every convolution way asks again; the answers hold for
  // the whole lowering (the graph, the views skipped and the ranges are fixed before it starts).
  mutable std::map<std::string, std::optional<Quant>> stored_quant_, quantized_output_;
  std::string kind_;
  std::string node_;
  WeightQuant weight_quant_{0}; // of the primitive the node adds next (quantize_weights)
};

// Whether oneDNN implementation `impl` is of `kind` ("ref", "gemm:"): oneDNN names them with an
// ISA family prefix ("x64:gemm:jit", "ref:any", "brgconv:avx2"), which this skips.
bool is_impl(const std::string& impl, std::string_view kind);

// Moves `pd` on to oneDNN's implementation `impl` ("" leaves it at the first), found by name on
// the same descriptors it was found on when offered (the plan cache's key holds oneDNN's version
// and ISA, so a cached choice meets the same list): the failure is a guard.
template <typename PrimitiveDesc>
void walk_to_impl(const Lowering& plan, const Node& node, PrimitiveDesc& pd,
                  const std::string& impl) {
  while (!impl.empty() && pd.impl_info_str() != impl)
    if (!pd.next_impl()) plan.fail(node, "oneDNN no longer offers the implementation " + impl);
}

// Weights of `rows` output rows (row-major, each row one output channel's) quantized per row as
// `wq` says: integer-valued floats (in [-levels, levels], twice that where doubled), so that a
// reorder to s8 is exact, and each row's scale (the step of its integers).
std::pair<std::vector<float>, std::vector<float>>
quantize_rows(const std::vector<float>& w, std::int64_t rows, const WeightQuant& wq);

// How an int8 convolution that oneDNN runs through implementation `impl` on a source of type
// `src` (u8 or s8), with `taps` (kernel height x width) and `depthwise` where each group is one
// input and one output channel, has its weights quantized. Without int8 dot products oneDNN's
// kernels multiply u8 x s8 bytes with vpmaddubsw, which sums each pair of neighbouring input
// channels' products (at one tap) in 16 bits, saturating past 32767, and on an s8 source every
// one of them halves the weights itself while reordering them (its scale_adjust 0.5: the source
// is shifted to u8):
// - with int8 dot products, and in oneDNN's reference kernels: 127 levels;
// - oneDNN's jit int8 depthwise kernels multiply in 32-bit lanes: 127, doubled on s8;
// - its jit kernel for AVX2 (jit_uni_int8, jit_uni_int8_1x1): 127 in pairs (255 x 128 = 32640),
//   doubled on s8;
// - any other: int8_weight_levels(), doubled on s8 (63 without dot products: no pair of them can
//   pass 255 x 63 x 2 = 32130, whichever channels a kernel pairs).
// Doubled, the integers chosen here are the ones oneDNN keeps, not rounded a second time by its
// halving.
WeightQuant conv_weight_quant(const std::string& impl, dnnl::memory::data_type src, bool depthwise,
                              int taps);
// The same for an inner product (a Gemm, a MatMul with constant weights, a convolution as one)
// whose reduction is the weights' rows as given (a source of two axes): oneDNN's GEMM kernel
// without dot products (gemm_s8u8s32, which shifts an s8 source to u8 and does not halve) pairs
// neighbouring columns within blocks of the reduction that may start at an odd column, so every
// neighbouring pair is bounded: 127 in pairs; int8_weight_levels() for any other kernel.
WeightQuant inner_product_weight_quant(const std::string& impl);

// y = x * scale[c] + shift[c] over channel axis 1 of `x` (plain, of shape `xs`, its data type):
// one oneDNN binary with the shift as its post-op, into a new buffer (ops/norm.cpp).
ArgRef per_channel_affine(Lowering& plan, ArgRef x, const Shape& xs, std::vector<float> scale,
                          std::vector<float> shift, const std::string& label);

} // namespace kdflow::teacher
