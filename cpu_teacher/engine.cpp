// Teacher execution plan: one oneDNN primitive (or, rarely, a plain kernel) per remaining node,
// lowered by its op table entry (ops/*.cpp), layouts chosen by the primitives, reorders inserted
// only where a consumer wants another layout (in practice: at the graph input and outputs),
// everything allocated before the first batch.
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/precision_names.hpp"

#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/versions.hpp"
#include "ops/common.hpp"
#include "ops/lowering.hpp"
#include "ops/op_table.hpp"
#include "ops/planar.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

#include <fmt/format.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

namespace kdflow::teacher {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"fp32", "bf16", "int8"};
  return names;
}

Precision parse_precision(const std::string& text) {
  if (text == precision_names()[0]) return Precision::fp32;
  if (text == precision_names()[1]) return Precision::bf16;
  if (text == precision_names()[2]) return Precision::int8;
  throw InputError(fmt::format("precision '{}' is not fp32, bf16 or int8", text));
}

const char* precision_name(Precision p) {
  switch (p) {
  case Precision::fp32: return "fp32";
  case Precision::bf16: return "bf16";
  case Precision::int8: return "int8";
  }
  return "?";
}

Tune parse_tune(const std::string& text) {
  if (text == "auto") return Tune::automatic;
  if (text == "off") return Tune::off;
  throw InputError(fmt::format("teacher.tune '{}' is not auto or off", text));
}

const char* tune_name(Tune t) { return t == Tune::automatic ? "auto" : "off"; }

std::optional<Shape> parse_input_size(const std::string& text, const std::string& key) {
  if (text == "auto") return std::nullopt;
  const auto side = [&](const std::string& item) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || item[0] < '0' || item[0] > '9' || *end != '\0' || v < 1 ||
        v > kMaxInputSide)
      throw InputError(fmt::format("{} = \"{}\": want auto, N or HxW with sides from 1 to {}", key,
                                   text, kMaxInputSide));
    return static_cast<std::int64_t>(v);
  };
  const auto x = text.find('x');
  if (x == std::string::npos) return Shape{0, side(text), side(text)};
  return Shape{0, side(text.substr(0, x)), side(text.substr(x + 1))};
}

namespace {
// oneDNN's ISAs are sets of bits, each holding the bits of those it extends: whether the
// effective ISA (ONEDNN_MAX_CPU_ISA included) has everything `base` has. A list of the ISAs with
// a feature misses those added later, or between: avx512_core_fp16 (an AVX-512 FP16 CPU whose
// AMX is off or hidden, as under some hypervisors) has AVX512_BF16 and VNNI.
bool effective_isa_has(dnnl::cpu_isa base) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(base)) == static_cast<unsigned>(base);
}
} // namespace

bool has_native_bf16() {
  return effective_isa_has(dnnl::cpu_isa::avx512_core_bf16) ||
         effective_isa_has(dnnl::cpu_isa::avx2_vnni_2);
}

bool has_native_int8() {
  return effective_isa_has(dnnl::cpu_isa::avx512_core_vnni) ||
         effective_isa_has(dnnl::cpu_isa::avx2_vnni);
}

bool has_int8() { return has_native_int8() || effective_isa_has(dnnl::cpu_isa::avx2); }

int int8_weight_levels() { return has_native_int8() ? 127 : 63; }

namespace {

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

// Refused below AVX2: oneDNN's int8 kernels need AVX2's byte multiplies at least (without VNNI
// the weights are held so that no 16-bit sum of two products saturates: has_int8).
void refuse_int8_without_kernels(const std::string& path) {
  if (!has_int8())
    throw InputError(fmt::format(
        "{}: teacher.precision = int8 needs a CPU with AVX2 at least (fastest with int8 dot "
        "products: AVX512_VNNI, AVX-VNNI or AMX), and this one runs oneDNN's {} ISA; use fp32",
        path, onednn_info().isa));
}

} // namespace

Lowering::Lowering(Teacher::Plan& plan)
    : p_(plan), g_(plan.graph), act_(plan.precision == Precision::bf16 ? dt::bf16 : dt::f32) {}
// (Under int8 act() is f32: products read their inputs through get_quantized, and only a
// product whose readers are all quantized products, or convolutions summing into it quantized,
// writes u8/s8: quantized_output.)

void Lowering::build(const std::vector<std::string>& features) {
  p_.input_md = plain(g_.input_shape, dt::f32);
  loc_[g_.input] = ArgRef{ArgRef::Kind::input, 0, 0, p_.input_md};
  find_flatten_into_gemm();
  find_wide_values();
  features_.insert(features.begin(), features.end());
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
    if (!loc_.count(outs[k]))
      throw InputError(fmt::format("{}: graph output '{}' does not depend on the input (the "
                                   "exporter or kdflow folded it to a constant): not a teacher",
                                   g_.file, outs[k]));
    const Shape& s = g_.shape(outs[k]);
    const memory::desc user = plain(s, dt::f32);
    p_.outputs.push_back({outs[k], s, user});
    const ArgRef src = at(outs[k]);
    add_reorder(src, ArgRef{ArgRef::Kind::output, static_cast<int>(k), 0, user},
                "output " + outs[k], outs[k]);
  }
}

void Lowering::fail(const Node& node, const std::string& what) const {
  throw InputError(fmt::format("{}: {}: {}", g_.file, node.describe(), what));
}

// --- values --------------------------------------------------------------------------------------

const ArgRef& Lowering::view_at(const std::string& value) const {
  const auto it = loc_.find(value);
  if (it == loc_.end())
    throw std::logic_error("teacher plan: value '" + value + "' not computed (lowering '" + node_ +
                           "')");
  return it->second;
}

const ArgRef& Lowering::at(const std::string& value) {
  const ArgRef& cur = view_at(value);
  if (!is_view(value)) return cur;
  const ArgRef view = cur;
  const ArgRef dst = new_buffer(plain(g_.shape(value), view.md.get_data_type()));
  // Plain in the view's axes is plain in the value's: the same bytes.
  add_reorder(view,
              ArgRef{dst.kind, dst.index, dst.offset,
                     plain(Shape(view.md.get_dims()), view.md.get_data_type())},
              value + " (a view)", value);
  views_.erase(value);
  return loc_[value] = dst;
}

const ArgRef& Lowering::dense(const std::string& value) {
  if (is_view(value)) {
    const ArgRef& view = view_at(value);
    const Shape& shape = g_.shape(value);
    const auto bytes =
        static_cast<std::size_t>(numel(shape)) * memory::data_type_size(view.md.get_data_type());
    if (view.md.get_dims() == memory::dims(shape.begin(), shape.end()) &&
        view.md.get_size() == bytes)
      return view;
  }
  return at(value);
}

std::optional<ArgRef> Lowering::strided(const std::string& value) const {
  const ArgRef& cur = view_at(value);
  if (cur.md.get_format_kind() != memory::format_kind::blocked || cur.md.get_inner_nblks() != 0)
    return std::nullopt;
  const Shape& shape = g_.shape(value);
  const Fine f = fine_of(value);
  if (shape.empty() || f.group.size() != shape.size()) return std::nullopt;
  memory::dims strides(shape.size());
  std::size_t end = f.size.size();
  for (std::size_t a = shape.size(); a-- > 0;) { // each axis's fine axes, innermost last
    const std::size_t first = end - static_cast<std::size_t>(f.group[a]);
    std::int64_t stride = 0, extent = 1; // the innermost fine axis of more than one element's
    for (std::size_t j = end; j-- > first;) {
      if (f.size[j] == 1) continue;
      if (extent > 1 && f.stride[j] != stride * extent) return std::nullopt;
      if (extent == 1) stride = f.stride[j];
      extent *= f.size[j];
    }
    strides[a] = extent > 1 ? stride : 1;
    end = first;
  }
  return ArgRef{
      cur.kind, cur.index, cur.offset,
      memory::desc(memory::dims(shape.begin(), shape.end()), cur.md.get_data_type(), strides)};
}

// --- views ---------------------------------------------------------------------------------------

bool Lowering::may_view(const Node& node, std::size_t k) const {
  if (p_.observe || node.inputs.empty() || k >= node.outputs.size()) return false;
  const std::string& in = node.inputs[0];
  const std::string& out = node.outputs[k];
  if (g_.is_output(out) || is_feature(out) || g_.is_output(in) || is_feature(in)) return false;
  if (g_.shape(out).empty()) return false; // oneDNN has no 0-d memory
  const ArgRef& src = view_at(in);
  return src.kind == ArgRef::Kind::buffer &&
         src.md.get_format_kind() == memory::format_kind::blocked && src.md.get_inner_nblks() == 0;
}

Lowering::Fine Lowering::fine_of(const std::string& value) const {
  const memory::desc& md = view_at(value).md;
  Fine f{md.get_dims(), md.get_strides(), {}};
  const auto it = views_.find(value);
  if (it != views_.end())
    f.group = it->second;
  else
    f.group.assign(f.size.size(), 1);
  return f;
}

bool Lowering::set_fine(const Node& node, std::size_t offset, Fine f, std::size_t k) {
  if (f.size.empty() || f.size.size() > DNNL_MAX_NDIMS) return false;
  const ArgRef& src = view_at(node.inputs[0]);
  memory::desc md;
  try { // oneDNN refuses strides under which elements overlap (a slice's step past the next axis)
    md = memory::desc(f.size, src.md.get_data_type(), f.stride);
  } catch (const dnnl::error&) {
    return false;
  }
  set(node.outputs[k], ArgRef{src.kind, src.index, src.offset + offset, md});
  views_[node.outputs[k]] = std::move(f.group);
  return true;
}

bool Lowering::view_permuted(const Node& node, const std::vector<std::int64_t>& perm) {
  if (!may_view(node)) return false;
  const Fine f = fine_of(node.inputs[0]);
  std::vector<std::size_t> first(f.group.size(), 0); // each axis's first fine axis
  for (std::size_t k = 1; k < f.group.size(); ++k)
    first[k] = first[k - 1] + static_cast<std::size_t>(f.group[k - 1]);
  Fine out;
  for (const auto axis : perm) {
    const auto a = static_cast<std::size_t>(axis);
    for (int j = 0; j < f.group[a]; ++j) {
      out.size.push_back(f.size[first[a] + static_cast<std::size_t>(j)]);
      out.stride.push_back(f.stride[first[a] + static_cast<std::size_t>(j)]);
    }
    out.group.push_back(f.group[a]);
  }
  return set_fine(node, 0, std::move(out));
}

bool Lowering::view_reshaped(const Node& node) {
  if (!may_view(node)) return false;
  const Fine f = fine_of(node.inputs[0]);
  // The fine axes in order, those of size 1 left out (their strides say nothing); each new axis
  // takes the next ones whose sizes multiply to its own, splitting one where the new axis ends
  // inside it.
  std::vector<std::pair<std::int64_t, std::int64_t>> left; // (size, stride), innermost last
  for (std::size_t k = f.size.size(); k-- > 0;)
    if (f.size[k] != 1) left.emplace_back(f.size[k], f.stride[k]);
  Fine out;
  for (const std::int64_t want : g_.shape(node.outputs[0])) {
    if (want <= 0) return false;
    int taken = 0;
    for (std::int64_t need = want; need > 1; ++taken) {
      if (left.empty()) return false;
      auto& [n, stride] = left.back();
      if (n <= need) {
        if (need % n != 0) return false;
        out.size.push_back(n);
        out.stride.push_back(stride);
        need /= n;
        left.pop_back();
      } else { // the new axis ends inside this one: its outer `need` steps, the rest stays
        if (n % need != 0) return false;
        out.size.push_back(need);
        out.stride.push_back(stride * (n / need));
        n /= need;
        need = 1;
      }
    }
    if (taken == 0) { // an axis of size 1
      out.size.push_back(1);
      out.stride.push_back(1);
      taken = 1;
    }
    out.group.push_back(taken);
  }
  if (!left.empty()) return false;
  return set_fine(node, 0, std::move(out));
}

bool Lowering::view_selected(const Node& node, std::size_t axis, std::int64_t index,
                             std::size_t index_rank) {
  if (!may_view(node)) return false;
  const Fine f = fine_of(node.inputs[0]);
  Fine out;
  std::size_t offset = 0, k = 0;
  for (std::size_t a = 0; a < f.group.size(); ++a) {
    const auto n = static_cast<std::size_t>(f.group[a]);
    if (a != axis) {
      for (std::size_t j = 0; j < n; ++j) {
        out.size.push_back(f.size[k + j]);
        out.stride.push_back(f.stride[k + j]);
      }
      out.group.push_back(f.group[a]);
    } else {
      std::int64_t rest = index; // its digit on each fine axis, innermost first
      for (std::size_t j = n; j-- > 0;) {
        offset += static_cast<std::size_t>((rest % f.size[k + j]) * f.stride[k + j]);
        rest /= f.size[k + j];
      }
      for (std::size_t j = 0; j < index_rank; ++j) {
        out.size.push_back(1);
        out.stride.push_back(1);
        out.group.push_back(1);
      }
    }
    k += n;
  }
  return set_fine(node, offset * memory::data_type_size(view_at(node.inputs[0]).md.get_data_type()),
                  std::move(out));
}

bool Lowering::view_gathered(const Node& node, std::size_t axis,
                             const std::vector<std::int64_t>& indices, const Shape& index_shape) {
  if (!may_view(node) || indices.empty()) return false;
  const Fine f = fine_of(node.inputs[0]);
  std::size_t first = 0; // the axis's fine axis: one, so that an index is a multiple of its stride
  for (std::size_t a = 0; a < axis; ++a) first += static_cast<std::size_t>(f.group[a]);
  if (f.group[axis] != 1) return false;
  // The indices must step evenly along each of their axes: index = base + sum(i_k * step_k).
  const Shape at = strides_of(index_shape);
  std::vector<std::int64_t> step(index_shape.size(), 1);
  for (std::size_t k = 0; k < index_shape.size(); ++k)
    if (index_shape[k] > 1) {
      step[k] = indices[static_cast<std::size_t>(at[k])] - indices[0];
      if (step[k] <= 0) return false;
    }
  for (std::size_t flat = 0; flat < indices.size(); ++flat) {
    std::int64_t want = indices[0], rest = static_cast<std::int64_t>(flat);
    for (std::size_t k = 0; k < index_shape.size(); ++k) {
      want += rest / at[k] * step[k];
      rest %= at[k];
    }
    if (indices[flat] != want) return false;
  }
  Fine out;
  for (std::size_t j = 0; j < first; ++j) {
    out.size.push_back(f.size[j]);
    out.stride.push_back(f.stride[j]);
  }
  out.group.assign(f.group.begin(), f.group.begin() + static_cast<std::ptrdiff_t>(axis));
  for (std::size_t k = 0; k < index_shape.size(); ++k) {
    out.size.push_back(index_shape[k]);
    out.stride.push_back(step[k] * f.stride[first]);
    out.group.push_back(1);
  }
  for (std::size_t j = first + 1; j < f.size.size(); ++j) {
    out.size.push_back(f.size[j]);
    out.stride.push_back(f.stride[j]);
  }
  out.group.insert(out.group.end(), f.group.begin() + static_cast<std::ptrdiff_t>(axis) + 1,
                   f.group.end());
  const std::size_t offset = static_cast<std::size_t>(indices[0] * f.stride[first]) *
                             memory::data_type_size(view_at(node.inputs[0]).md.get_data_type());
  return set_fine(node, offset, std::move(out));
}

bool Lowering::view_window(const Node& node, std::size_t k, const std::vector<std::int64_t>& start,
                           const std::vector<std::int64_t>& step) {
  if (!may_view(node, k)) return false;
  const Fine f = fine_of(node.inputs[0]);
  const Shape& in = g_.shape(node.inputs[0]);
  const Shape& os = g_.shape(node.outputs[k]);
  if (start.size() != in.size() || step.size() != in.size() || os.size() != in.size()) return false;
  Fine out = f;
  std::int64_t offset = 0;
  std::size_t first = 0; // the axis's first fine axis
  for (std::size_t a = 0; a < in.size(); first += static_cast<std::size_t>(f.group[a]), ++a) {
    if (os[a] <= 0 || step[a] <= 0) return false;
    if (start[a] == 0 && step[a] == 1 && os[a] == in[a]) continue;
    if (f.group[a] == 1) {
      out.size[first] = os[a];
      out.stride[first] = f.stride[first] * step[a];
      offset += start[a] * f.stride[first];
      continue;
    }
    // An axis made of several fine ones: a run of whole steps of its outermost.
    std::int64_t inner = 1;
    for (std::size_t j = first + 1; j < first + static_cast<std::size_t>(f.group[a]); ++j)
      inner *= f.size[j];
    if (step[a] != 1 || start[a] % inner != 0 || os[a] % inner != 0) return false;
    out.size[first] = os[a] / inner;
    offset += start[a] / inner * f.stride[first];
  }
  return set_fine(node,
                  static_cast<std::size_t>(offset) *
                      memory::data_type_size(view_at(node.inputs[0]).md.get_data_type()),
                  std::move(out), k);
}

void Lowering::before_overwrite(const std::string& value) {
  const ArgRef& target = view_at(value);
  if (target.kind != ArgRef::Kind::buffer) return;
  const int buffer = target.index;
  std::vector<std::string> pending;
  for (const auto& [v, group] : views_)
    if (const ArgRef& r = view_at(v); r.kind == ArgRef::Kind::buffer && r.index == buffer)
      pending.push_back(v);
  for (const auto& v : pending) (void)at(v);
}

ArgRef Lowering::new_buffer(const memory::desc& md) {
  p_.buffer_bytes.push_back(md.get_size());
  return ArgRef{ArgRef::Kind::buffer, static_cast<int>(p_.buffer_bytes.size() - 1), 0, md};
}

void Lowering::add_reorder(const ArgRef& src, const ArgRef& dst, const std::string& label,
                           const std::string& value) {
  const dnnl::reorder::primitive_desc pd(p_.eng, src.md, p_.eng, dst.md);
  Step s;
  s.prim = dnnl::reorder(pd);
  s.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  s.label = "reorder " + label;
  s.kind = "reorder";
  s.node = node_;
  s.reorder = true;
  s.value = value;
  if (const auto w = p_.written.find(value); !value.empty() && w != p_.written.end())
    s.producer = w->second.node;
  p_.steps.push_back(std::move(s));
}

ArgRef Lowering::get(const std::string& value, const memory::desc& want) {
  // A view: read in place where it lies as wanted (a reader never writes what it reads: a
  // residual sum calls before_overwrite first); else its plain copy where that is what is wanted
  // (kept as the value's place for every later reader), else one reorder from the view into
  // `want` (seen in the view's axes where those are finer than the value's), or where `want` is
  // blocked and the view's axes are finer, the plain copy reordered.
  std::optional<memory::desc> fine_want;
  if (is_view(value)) {
    const memory::desc& md = view_at(value).md;
    if (md == want) return view_at(value);
    const bool finer = md.get_ndims() != want.get_ndims();
    if (finer && want != plain(g_.shape(value), md.get_data_type()))
      fine_want = in_fine_axes(value, want);
    if (want == plain(g_.shape(value), md.get_data_type()) || (finer && !fine_want))
      (void)at(value);
  }
  const ArgRef& cur = view_at(value);
  if (cur.md == want) return cur;
  for (const auto& [name, ref] : converted_)
    if (name == value && ref.md == want) return ref;
  ArgRef dst = new_buffer(want);
  const bool view = is_view(value);
  add_reorder(cur, fine_want ? ArgRef{dst.kind, dst.index, dst.offset, *fine_want} : dst,
              view ? value + " (a view)" : value, value);
  converted_.emplace_back(value, dst);
  return dst;
}

void Lowering::reorder_into(const std::string& value, const ArgRef& dst) {
  std::optional<memory::desc> fine;
  if (is_view(value) && view_at(value).md.get_ndims() != dst.md.get_ndims()) {
    fine = in_fine_axes(value, dst.md);
    if (!fine) (void)at(value);
  }
  const bool view = is_view(value);
  add_reorder(view_at(value), fine ? ArgRef{dst.kind, dst.index, dst.offset, *fine} : dst,
              view ? value + " (a view)" : value + " (into a slice)", value);
}

std::optional<memory::desc> Lowering::in_fine_axes(const std::string& value,
                                                   const memory::desc& want) const {
  if (want.get_format_kind() != memory::format_kind::blocked || want.get_inner_nblks() != 0)
    return std::nullopt;
  const Fine f = fine_of(value);
  const memory::dims ws = want.get_strides();
  if (ws.size() != f.group.size()) return std::nullopt;
  memory::dims strides(f.size.size());
  std::size_t first = 0; // each axis's stride split over its fine axes, innermost last
  for (std::size_t a = 0; a < f.group.size(); ++a) {
    const std::size_t end = first + static_cast<std::size_t>(f.group[a]);
    std::int64_t stride = ws[a];
    for (std::size_t j = end; j-- > first;) {
      strides[j] = stride;
      stride *= f.size[j];
    }
    first = end;
  }
  return memory::desc(f.size, want.get_data_type(), strides);
}

std::optional<Lowering::Quant> Lowering::quant_of(const std::string& value) const {
  if (p_.precision != Precision::int8 || !p_.calibration) return std::nullopt;
  const auto it = p_.calibration->ranges.find(value);
  if (it == p_.calibration->ranges.end()) return std::nullopt;
  const auto [lo, hi] = it->second;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return std::nullopt;
  const bool unsigned_ok = lo >= 0.f;
  const float top = unsigned_ok ? hi : std::max(-lo, hi);
  const float levels = unsigned_ok ? 255.f : 127.f;
  return Quant{unsigned_ok ? dt::u8 : dt::s8, top > 0.f ? top / levels : 1.f};
}

const std::string& Lowering::product_input(const Node& node) const {
  const std::string* flat = flat_source(node);
  return flat != nullptr ? *flat : node.inputs[0];
}

bool Lowering::quantizable(const Node& node) const {
  if (node.inputs.size() < 2 || g_.is_constant(node.inputs[0]) || !g_.is_constant(node.inputs[1]))
    return false;
  const Shape& w = g_.shape(node.inputs[1]);
  if (node.op == "Conv") return w.size() == 4;
  if (node.op != "Gemm" && node.op != "MatMul") return false;
  if (g_.is_output(node.outputs[0]) || node.int_attr("transA", 0) != 0) return false;
  // What runs as one inner product (ops/gemm.cpp): A of [M, K] and B of [K, N]. The passes make
  // every MatMul with a constant 2-D B such a Gemm over A's rows (matmul_as_gemm).
  return w.size() == 2 && g_.shape(node.inputs[0]).size() == 2;
}

std::optional<Lowering::Quant> Lowering::quant_input(const Node& node) const {
  if (p_.precision != Precision::int8 || !quantizable(node)) return std::nullopt;
  return quant_of(product_input(node));
}

std::optional<Lowering::Quant> Lowering::quantized_output(const Node& node) const {
  // By its output: a graph assigns each value once (node names need not be unique).
  if (const auto it = quantized_output_.find(node.outputs[0]); it != quantized_output_.end())
    return it->second;
  std::optional<Quant> q = written_quant(node);
  quantized_output_.emplace(node.outputs[0], q);
  return q;
}

std::optional<Lowering::Quant> Lowering::written_quant(const Node& node) const {
  // How the node writing `value` writes it: nullopt where none does (a graph input) or where that
  // node is taken into another step.
  const auto producer_wrote = [&](const std::string& value) -> std::optional<Quant> {
    const int p = g_.producer(value);
    if (p < 0 || skipped_.count(g_.nodes[static_cast<std::size_t>(p)].name) != 0)
      return std::nullopt;
    return quantized_output(g_.nodes[static_cast<std::size_t>(p)]);
  };
  if (node.op == "MaxPool") {
    // It pools in its input's stored type (ops/pool.cpp): quantized where its producer wrote the
    // input at the quantization its own readers take (readers_quant lets a MaxPool through).
    if (node.outputs.size() != 1) return std::nullopt;
    const auto q = stored_quant(node.outputs[0]);
    return q && producer_wrote(node.inputs[0]) == q ? q : std::nullopt;
  }
  if (!quant_input(node)) return std::nullopt;
  if (const PostOp* sum = sum_post(node)) {
    // Only a convolution sums into a quantized summand (ops/conv.cpp), and only into one its
    // producer wrote quantized.
    if (node.op != "Conv" || !producer_wrote(sum->sum_input)) return std::nullopt;
  }
  return stored_quant(node.outputs[0]);
}

std::optional<Lowering::Quant> Lowering::stored_quant(const std::string& value) const {
  if (p_.precision != Precision::int8) return std::nullopt;
  if (const auto it = stored_quant_.find(value); it != stored_quant_.end()) return it->second;
  std::optional<Quant> q = readers_quant(value);
  stored_quant_.emplace(value, q);
  return q;
}

std::optional<Lowering::Quant> Lowering::readers_quant(const std::string& value) const {
  // Every reader, through views (a Reshape between a Gemm and the next), must be a quantized
  // product reading it as its input only, all at one quantization (views hold the same data, so
  // their calibrated ranges are the value's), or a convolution summing into it that writes its
  // own output quantized, in the same type.
  // The partial sum of a convolution split over a Concat's inputs (split_conv_over_concat) stays
  // f32: quantized, the sum would round twice (its share, then the whole) where the one
  // convolution rounded once; the parts summing into it then write f32 too (written_quant).
  if (const int p = g_.producer(value);
      p >= 0 && g_.nodes[static_cast<std::size_t>(p)].int_attr("partial_sum", 0) != 0)
    return std::nullopt;
  std::optional<Quant> q;
  std::vector<dt> summed_into; // the types those convolutions write
  std::vector<std::string> todo = {value};
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    const auto readers = g_.consumers(v);
    if (g_.is_output(v) || readers.empty()) return std::nullopt;
    for (const std::size_t r : readers) {
      const Node& reader = g_.nodes[r];
      if (skipped_.count(reader.name) != 0 || reader.inputs.empty()) return std::nullopt;
      const PostOp* sum = sum_post(reader);
      if (sum != nullptr && sum->sum_input == v) {
        const auto out = reader.op == "Conv" && v == value &&
                                 std::find(reader.inputs.begin(), reader.inputs.end(), v) ==
                                     reader.inputs.end() &&
                                 quant_input(reader)
                             ? stored_quant(reader.outputs[0])
                             : std::nullopt;
        if (!out) return std::nullopt;
        summed_into.push_back(out->type);
        continue;
      }
      if (reader.inputs[0] != v) return std::nullopt;
      if (reader.op == "MaxPool") {
        // Order-preserving: max pooling commutes with quantization at one scale, so the value is
        // stored as the pooled output is (pooled in that type) where that is quantized. Only as
        // the value's own reader (not through a view): written_quant finds the MaxPool's
        // producer by its input.
        const auto qr = reader.outputs.size() == 1 && v == value ? stored_quant(reader.outputs[0])
                                                                 : std::nullopt;
        if (!qr || (q && *q != *qr)) return std::nullopt;
        q = qr;
        continue;
      }
      for (std::size_t k = 1; k < reader.inputs.size(); ++k)
        if (!reader.inputs[k].empty() && !g_.is_constant(reader.inputs[k])) return std::nullopt;
      const OpDef* op = find_op(reader.op);
      if (op != nullptr && op->view && reader.outputs.size() == 1) {
        todo.push_back(reader.outputs[0]);
        continue;
      }
      const auto qr = quant_input(reader);
      if (!qr || product_input(reader) != v || (q && *q != *qr)) return std::nullopt;
      q = qr;
    }
  }
  // Read by sums only (a ResNet's downsampling shortcut): stored at its own calibrated range.
  // The convolutions summing into it write their output into its buffer, in a type of the same
  // size (u8 over an s8 summand: oneDNN's sum post-op reads the summand in its own type).
  if (!q && !summed_into.empty()) q = quant_of(value);
  for (const dt t : summed_into)
    if (!q || memory::data_type_size(t) != memory::data_type_size(q->type)) return std::nullopt;
  return q;
}

ArgRef Lowering::get_quantized(const std::string& value, const memory::desc& want, const Quant& q) {
  if (is_view(value) && view_at(value).md.get_ndims() != want.get_ndims()) (void)at(value);
  const ArgRef& cur = view_at(value);
  if (cur.md == want) return cur;
  for (const auto& [name, ref] : converted_)
    if (name == value && ref.md == want) return ref;
  if (cur.md.get_data_type() == q.type) return get(value, want); // written quantized: layout only
  ArgRef dst = new_buffer(want);
  Step s;
  if (auto k = planar_to_channels_last(cur.md, want, q.scale)) { // the network's image input
    s.kernel = std::move(k->kernel);
    s.impl = std::move(k->impl);
    s.args = {{0, cur}, {0, dst}};
  } else {
    dnnl::primitive_attr attr;
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    s.prim = dnnl::reorder(dnnl::reorder::primitive_desc(p_.eng, cur.md, p_.eng, want, attr));
    s.args = {{DNNL_ARG_FROM, cur},
              {DNNL_ARG_TO, dst},
              {DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, scales({q.scale})}};
  }
  s.label = "reorder (quantize) " + value;
  s.kind = "reorder";
  s.node = node_;
  s.reorder = true;
  s.value = value;
  if (const auto w = p_.written.find(value); w != p_.written.end()) s.producer = w->second.node;
  p_.steps.push_back(std::move(s));
  converted_.emplace_back(value, dst);
  return dst;
}

void Lowering::set_quant_masks(dnnl::primitive_attr& attr, const std::optional<Quant>& q,
                               const std::optional<Quant>& q_out, int weights_mask) {
  if (q) {
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, weights_mask);
  }
  if (q_out) attr.set_scales_mask(DNNL_ARG_DST, 0);
}

void Lowering::add_quant_scales(std::vector<std::pair<int, ArgRef>>& args,
                                const std::optional<Quant>& q, std::vector<float> weight_scales,
                                const std::optional<Quant>& q_out) {
  if (q) {
    args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, scales({q->scale}));
    args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, scales(std::move(weight_scales)));
  }
  if (q_out) args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, scales({q_out->scale}));
}

ArgRef Lowering::scales(std::vector<float> values) {
  const memory::desc md({static_cast<memory::dim>(values.size())}, dt::f32, memory::format_tag::a);
  return weight(std::move(values), md, md);
}

void Lowering::set(const std::string& value, ArgRef ref) {
  p_.written[value] = {node_, ref.md};
  loc_[value] = std::move(ref);
  views_.erase(value);
  converted_.erase(std::remove_if(converted_.begin(), converted_.end(),
                                  [&](const auto& c) { return c.first == value; }),
                   converted_.end());
}

ArgRef Lowering::weight(std::vector<float> data, const memory::desc& user_md,
                        const memory::desc& want) {
  p_.weight_storage.push_back(std::move(data));
  memory user(user_md, p_.eng, p_.weight_storage.back().data());
  memory w(want, p_.eng);
  dnnl::stream s(p_.eng);
  dnnl::reorder(user, w).execute(s, user, w);
  s.wait();
  p_.weights.push_back(w);
  return ArgRef{ArgRef::Kind::weight, static_cast<int>(p_.weights.size() - 1), 0, want};
}

ArgRef Lowering::constant(const std::string& name, const Shape& as_shape,
                          const std::optional<memory::desc>& want) {
  const Tensor& t = g_.constants.at(name);
  std::vector<float> data(static_cast<std::size_t>(t.size()));
  for (std::int64_t k = 0; k < t.size(); ++k)
    data[static_cast<std::size_t>(k)] = static_cast<float>(t.at(k));
  const memory::desc md = plain(as_shape, dt::f32);
  return weight(std::move(data), md, want.value_or(md));
}

// --- steps ---------------------------------------------------------------------------------------

void Lowering::add_primitive(dnnl::primitive prim, std::vector<std::pair<int, ArgRef>> args,
                             const std::string& label, const memory::desc& scratchpad) {
  p_.scratchpad_bytes = std::max(p_.scratchpad_bytes, scratchpad.get_size());
  Step s;
  s.prim = std::move(prim);
  s.args = std::move(args);
  s.label = label;
  s.kind = kind_;
  s.node = node_;
  const WeightQuant wq = std::exchange(weight_quant_, WeightQuant{0});
  s.weight_levels = wq.levels;
  s.weight_pairs = wq.pair_taps > 0;
  p_.steps.push_back(std::move(s));
}

void Lowering::add_kernel(Kernel k, std::vector<ArgRef> operands, const std::string& label,
                          KernelLoop loop, std::string impl) {
  Step s;
  s.kernel = std::move(k);
  s.loop = loop;
  for (auto& o : operands) s.args.emplace_back(0, std::move(o));
  s.label = !impl.empty()              ? label
            : loop == KernelLoop::rows ? label + " (plain kernel)"
                                       : label + " (reference loop)";
  s.impl = std::move(impl);
  s.kind = kind_;
  s.node = node_;
  p_.steps.push_back(std::move(s));
}

dnnl::primitive_attr Lowering::attr_with(const Node& node, float scale, float sum_scale,
                                         dt sum_type) const {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (scale != 1.f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, scale, 0.f);
  append_post_ops(ops, node, sum_scale, sum_type);
  attr.set_post_ops(ops);
  return attr;
}

dnnl::primitive_attr Lowering::attr_with_depthwise(const Node& pointwise, const Node& depthwise,
                                                   dt weights, dt dst, int stride) const {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  append_post_ops(ops, pointwise, 1.f);
  ops.append_dw(weights, dt::f32, dst, 3, stride, 1);
  append_post_ops(ops, depthwise, 1.f);
  attr.set_post_ops(ops);
  return attr;
}

void Lowering::append_post_ops(dnnl::post_ops& ops, const Node& node, float sum_scale,
                               dt sum_type) const {
  for (const auto& post : node.post_ops) {
    if (post.kind == PostOp::Kind::sum) {
      ops.append_sum(sum_scale, 0, sum_type);
    } else {
      const Activation& a = *find_op(post.op)->activation;
      const auto [alpha, beta] = a.onednn_params.value_or(std::pair{post.alpha, post.beta});
      ops.append_eltwise(static_cast<dnnl::algorithm>(a.algorithm_for(post.alpha)), alpha, beta);
    }
  }
}

dnnl::primitive_attr Lowering::plain_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool Lowering::conv_into_channels_last(const Node& node) const {
  if (!g_.is_constant(node.inputs[1])) return false;
  if (node.inputs.size() > 2 && !node.inputs[2].empty() && !g_.is_constant(node.inputs[2]))
    return false;
  if ((act() != dt::f32 && act() != dt::bf16) || type_of(node.outputs[0]) != act() || observing() ||
      quant_input(node) || quantized_output(node))
    return false;
  const PostOp* sum = sum_post(node);
  return sum == nullptr ||
         view_at(sum->sum_input).md ==
             memory::desc(dims_of(g_.shape(node.outputs[0])), act(), memory::format_tag::acdb);
}

const PostOp* Lowering::sum_post(const Node& node) {
  for (const auto& p : node.post_ops)
    if (p.kind == PostOp::Kind::sum) return &p;
  return nullptr;
}

const std::string* Lowering::flat_source(const Node& node) const {
  const auto it = flat_source_.find(node.name);
  return it == flat_source_.end() ? nullptr : &it->second;
}

// --- bf16 as PyTorch's autocast runs it ---------------------------------------------------------
// Under teacher.precision = bf16 the products (Conv, Gemm, MatMul, Einsum) read bf16 and write
// bf16, as CPU autocast runs them; every other value keeps the type PyTorch's type promotion gives
// it there, so that kdflow's bf16 teacher rounds where PyTorch's own bf16 run rounds and no more.
// A value is wide (f32) when it is the input, when a product's fused residual sum accumulates into
// a wide value, when a product is the partial sum of a convolution split over a Concat's inputs
// (split_conv_over_concat: the one convolution accumulated in f32), or when another op computes it
// from a wide value or, for arithmetic, concatenation, selection and gathers, from a parameter
// tensor (a float constant of more than one element: a layer scale, a position embedding, a class
// token, an attention bias); one-element constants promote nothing, as PyTorch's Python numbers and
// 0-d tensors do not. Normalizations read their scale and shift as parameters of their own and keep
// their input's type. In ViTs, ConvNeXts and Swins this keeps the residual stream and the attention
// logits in f32, as PyTorch does; a CNN with batch norm stays bf16 throughout.
void Lowering::find_wide_values() {
  if (act_ == dt::f32) return;
  static const std::set<std::string> products = {"Conv", "ConvTranspose", "Gemm", "MatMul",
                                                 "Einsum"};
  static const std::set<std::string> promoting = {"Add",
                                                  "Sub",
                                                  "Mul",
                                                  "Div",
                                                  "Pow",
                                                  "Max",
                                                  "Min",
                                                  "Sum",
                                                  "Mean",
                                                  "Where",
                                                  "Concat",
                                                  "Gather",
                                                  "GatherElements",
                                                  "GatherND",
                                                  "Expand",
                                                  "Tile"};
  wide_.insert(g_.input);
  for (const auto& node : g_.nodes) {
    bool wide = false;
    if (products.count(node.op) != 0) {
      const PostOp* sum = sum_post(node);
      // a partial sum (a convolution split over a Concat's inputs) accumulates in f32 as the one
      // product did; the parts summing into it then write f32 too, and a product reading their
      // output rounds it to bf16 as it reads it (other readers read f32: the price of the sum
      // in place)
      wide = (sum != nullptr && wide_.count(sum->sum_input) != 0) ||
             node.int_attr("partial_sum", 0) != 0;
    } else {
      const bool promotes = promoting.count(node.op) != 0;
      for (const auto& in : node.inputs) {
        if (in.empty()) continue;
        if (!g_.is_constant(in)) {
          wide = wide || wide_.count(in) != 0;
        } else if (promotes) {
          const Tensor& t = g_.constants.at(in);
          wide = wide || (t.type == ElemType::f32 && t.size() > 1);
        }
      }
    }
    if (wide) wide_.insert(node.outputs.begin(), node.outputs.end());
  }
}

// --- a flattening view feeding a Gemm ------------------------------------------------------------
// Any view from [N, C, H, W] to [N, C*H*W] (Flatten, Reshape, Squeeze) before a Gemm or MatMul
// with a constant B: the inner product reads the 4-D tensor directly, in whatever layout it has.
void Lowering::find_flatten_into_gemm() {
  for (const auto& n : g_.nodes) {
    if ((n.op != "Gemm" && n.op != "MatMul") || !g_.is_constant(n.inputs[1])) continue;
    if (n.op == "Gemm" && n.int_attr("transA", 0)) continue;
    for (const auto& f : g_.nodes) {
      const OpDef* op = find_op(f.op);
      if (op == nullptr || !op->view || f.outputs[0] != n.inputs[0]) continue;
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

// --- nodes ---------------------------------------------------------------------------------------
void Lowering::add_node(const Node& node) {
  const OpDef* op = find_op(node.op);
  if (op == nullptr || op->lower == nullptr)
    fail(node, fmt::format("op type '{}' is not supported by kdflow's teacher", node.op));
  kind_ = node.op;
  node_ = node.name;
  weight_quant_ = WeightQuant{0};
  if (p_.observe && quantizable(node)) {
    observe(product_input(node));
    // A residual summand that only the sum reads is stored quantized at its own range.
    if (const PostOp* sum = sum_post(node); sum != nullptr && node.op == "Conv")
      observe(sum->sum_input);
  }
  op->lower(*this, node);
  node_.clear();
}

// A calibration step: the value's smallest and largest element so far (its whole buffer: a blocked
// layout's padding holds zeros, which at most widens the range to include 0).
void Lowering::observe(const std::string& value) {
  const auto seen = std::find(p_.observed_values.begin(), p_.observed_values.end(), value);
  if (seen != p_.observed_values.end()) return;
  const ArgRef& ref = at(value);
  if (ref.md.get_data_type() != dt::f32) return;
  const std::size_t slot = p_.observed_values.size();
  p_.observed_values.push_back(value);
  p_.observed->emplace_back(std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity());
  const std::size_t n = ref.md.get_size() / sizeof(float);
  add_kernel(
      [ranges = p_.observed, slot, n](std::byte* const* ptrs) {
        const auto* x = reinterpret_cast<const float*>(ptrs[0]);
        float lo = (*ranges)[slot].first, hi = (*ranges)[slot].second;
        for (std::size_t i = 0; i < n; ++i) {
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
        }
        (*ranges)[slot] = {lo, hi};
      },
      {ref}, "observe " + value);
}

void Lowering::skip(const std::string& name) {
  skipped_.insert(name);
  p_.taken_in[node_].push_back(name);
  for (auto o = p_.options.rbegin(); o != p_.options.rend(); ++o)
    if (o->node == node_) {
      o->takes_in = name;
      break;
    }
}

std::string Lowering::choose(const Node& node, std::vector<std::string> options) {
  const auto it = p_.choices.find(node.name);
  const bool listed = it != p_.choices.end() &&
                      std::find(options.begin(), options.end(), it->second) != options.end();
  std::string way = listed ? it->second : options.front();
  if (options.size() > 1) p_.options.push_back({node.name, std::move(options), way});
  return way;
}

namespace {

// Each feature a value the input reaches, once, and one row per sample: the slot holds a
// batch's features as [batch, ...] beside its logits.
void check_features(const Graph& g, const TeacherOptions& options) {
  const auto& features = options.features;
  for (auto f = features.begin(); f != features.end(); ++f) {
    const std::string what = fmt::format("{}: {} '{}'", g.file, options.features_source, *f);
    if (std::find(features.begin(), f, *f) != f) throw InputError(what + " is named twice");
    if (g.is_constant(*f))
      throw InputError(what + " is a constant of the graph (it does not depend on the input)");
    if (!g.shapes.count(*f))
      throw InputError(what + ": no value of the graph has this name (`kdflow teacher info` "
                              "lists them)");
    const Shape& s = g.shape(*f);
    if (s.empty() || s[0] != g.batch)
      throw InputError(fmt::format("{} has shape {}, which does not lead with the batch ({}): "
                                   "kdflow carries features one row per sample",
                                   what, format_shape(s), g.batch));
  }
}

} // namespace

LoadOptions load_options(const TeacherOptions& options) {
  LoadOptions lo;
  lo.batch = options.batch;
  lo.sample_shape = options.sample_shape;
  lo.sample_default = options.sample_default;
  lo.sample_source = options.sample_source;
  lo.limits = options.limits;
  lo.keep = options.features;
  return lo;
}

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
  if (options.precision == Precision::int8) {
    refuse_int8_without_kernels(path);
    if (!options.calibration)
      throw std::logic_error("teacher.precision = int8 without a calibration");
  }
  const int threads = replica_threads(options);
  if (options.passes_at_once < 0 ||
      (options.passes_at_once > 1 && options.passes_at_once != threads))
    throw InputError(fmt::format(
        "{}: {} passes at once with {} threads per replica: 1 (one pass at a time on every "
        "thread), {} (a pass per thread) or 0 (the tuner's choice)",
        path, options.passes_at_once, threads, threads));
  Graph graph = load_onnx(path, load_options(options));
  check_features(graph, options);
  const bool fixed_passes =
      options.samples_per_pass > 0 && options.samples_per_pass != options.batch;
  const bool whole = graph.chunks == 1 && !fixed_passes &&
                     (options.samples_per_pass > 0 || options.tune == Tune::off);
  if (options.passes_at_once > 1 && whole)
    throw InputError(fmt::format("{}: {} passes at once, but the batch of {} runs whole: give it "
                                 "passes (samples per pass{})",
                                 path, options.passes_at_once, options.batch,
                                 options.tune == Tune::off ? ", or tune it" : ""));
  // The tuner's passes at once start from a pass per thread: refused before any tuning.
  if (options.passes_at_once > 1 && graph.chunks == 1 && !fixed_passes &&
      options.batch < options.passes_at_once)
    throw InputError(fmt::format("{}: {} passes at once need a batch of at least {} samples (a "
                                 "pass per thread), and the batch is {}",
                                 path, options.passes_at_once, options.passes_at_once,
                                 options.batch));
  if (fixed_passes) {
    auto passes = load_onnx_in_passes(path, load_options(options), graph, options.samples_per_pass);
    if (!passes)
      throw InputError(fmt::format(
          "{}: teacher batch {} cannot run in passes of {} samples: the number must divide the "
          "batch, and the model compute each sample alike at both batches (no batch it fixes or "
          "hard-codes, every output and feature led by the batch)",
          path, options.batch, options.samples_per_pass));
    graph = std::move(*passes);
  }
  std::shared_ptr<Teacher> t(new Teacher());
  if (options.tune == Tune::automatic) {
    t->plan_ = tuned_plan(std::move(graph), options, path);
  } else {
    const int lanes = std::max(1, options.passes_at_once);
    t->plan_ = build_plan(std::move(graph), options, {}, lanes);
    if (!options.prefer.empty()) {
      auto ways = prefer_ways(t->plan_->options, options.prefer);
      t->plan_ = build_plan(std::move(t->plan_->graph), options, std::move(ways), lanes);
    }
    t->plan_->tune.passes_at_once = lanes;
    for (const auto& o : t->plan_->options)
      t->plan_->tune.nodes.push_back(
          {o.node, o.options, std::vector<double>(o.options.size(), -1.0), o.chosen});
  }
  if (fixed_passes) t->plan_->tune.samples_per_pass = options.samples_per_pass;
  if (t->plan_->graph.chunks > 1)
    for (const auto& o : t->plan_->outputs)
      if (o.shape.empty() || o.shape[0] != t->plan_->graph.batch)
        throw InputError(fmt::format("{}: the model fixes its batch at {}, and '{}' of shape {} "
                                     "does not lead with it",
                                     path, t->plan_->graph.batch, o.name, format_shape(o.shape)));
  return t;
}

namespace {

// Buffers whose lives (from the first step that names one to the last) do not overlap share
// memory: each gets an offset in one block per replica, placed largest first at the lowest offset
// clear of every buffer alive at the same time. (A network's activations then take about its two
// or three largest tensors, not their sum: densenet121 or convnext_tiny at 224 x 224 and batch 64
// would otherwise hold gigabytes per replica, and cold memory at that.)
void place_buffers(Teacher::Plan& p) {
  constexpr std::size_t kAlign = 64;
  const std::size_t n = p.buffer_bytes.size();
  std::vector<std::size_t> first(n, std::numeric_limits<std::size_t>::max()), last(n, 0);
  for (std::size_t i = 0; i < p.steps.size(); ++i)
    for (const auto& arg : p.steps[i].args)
      if (arg.second.kind == ArgRef::Kind::buffer) {
        const auto b = static_cast<std::size_t>(arg.second.index);
        first[b] = std::min(first[b], i);
        last[b] = std::max(last[b], i);
      }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return p.buffer_bytes[a] > p.buffer_bytes[b];
  });
  const auto size_of = [&](std::size_t b) {
    return std::max(kAlign, (p.buffer_bytes[b] + kAlign - 1) / kAlign * kAlign);
  };
  p.buffer_offset.assign(n, 0);
  p.arena_bytes = 0;
  std::vector<std::size_t> placed;
  for (const auto b : order) {
    std::vector<std::pair<std::size_t, std::size_t>> busy; // [offset, end) of live neighbours
    for (const auto o : placed)
      if (first[o] <= last[b] && first[b] <= last[o])
        busy.emplace_back(p.buffer_offset[o], p.buffer_offset[o] + size_of(o));
    std::sort(busy.begin(), busy.end());
    std::size_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo >= at + size_of(b)) break;
      at = std::max(at, hi);
    }
    p.buffer_offset[b] = at;
    p.arena_bytes = std::max(p.arena_bytes, at + size_of(b));
    placed.push_back(b);
  }
}

} // namespace

int replica_threads(const TeacherOptions& options) {
  return options.threads > 0 ? options.threads : oneapi::tbb::this_task_arena::max_concurrency();
}

std::unique_ptr<Teacher::Plan> Teacher::build_plan(Graph&& graph, const TeacherOptions& options,
                                                   std::map<std::string, std::string> choices,
                                                   int passes_at_once) {
  if (passes_at_once > 1) {
    // In an arena of one thread: oneDNN fixes how a primitive shares its work among threads when
    // it creates it, from the threads it sees then.
    TeacherOptions one = options;
    one.threads = 1;
    std::unique_ptr<Plan> plan;
    oneapi::tbb::task_arena(1).execute(
        [&] { plan = build_plan(std::move(graph), one, std::move(choices)); });
    plan->passes_at_once = passes_at_once;
    return plan;
  }
  auto plan = std::make_unique<Plan>();
  plan->graph = std::move(graph);
  plan->precision = options.precision;
  plan->calibration = options.calibration;
  plan->choices = std::move(choices);
  plan->threads = replica_threads(options);
  try {
    Lowering(*plan).build(options.features);
  } catch (...) {
    graph = std::move(plan->graph); // the caller keeps its graph (the lowering only reads it)
    throw;
  }
  place_buffers(*plan);
  return plan;
}

Calibration Teacher::calibrate(const std::string& path, const TeacherOptions& options,
                               std::span<const float> samples, const std::string& source) {
  // The fp32 plan, untuned, every node its first way (the ranges do not depend on the way).
  std::shared_ptr<Teacher> t(new Teacher());
  t->plan_ = std::make_unique<Plan>();
  Plan& plan = *t->plan_;
  // The features kept: the same graph (and value names) as the plan it calibrates.
  plan.graph = load_onnx(path, load_options(options));
  plan.observe = true;
  plan.threads = replica_threads(options);
  plan.observed = std::make_shared<std::vector<std::pair<float, float>>>();
  Lowering(plan).build({});
  place_buffers(plan);
  const auto batch_floats = static_cast<std::size_t>(numel(t->input_shape()));
  if (samples.empty() || samples.size() % batch_floats != 0)
    throw InputError(fmt::format(
        "{}: {} floats are not a whole number of the teacher's batches of {} (input {}): the "
        "int8 calibration runs whole batches",
        source, samples.size(), batch_floats, format_shape(t->input_shape())));
  std::string features;
  for (const auto& f : options.features) features += f + ",";
  // (v2: the ranges of residual summands that only a sum reads are observed too; v3: the values
  // of convolutions split over a Concat's inputs, whose ranges v2 did not have; v4: a linear
  // layer's output with a per-channel scale folded into its weights, under the same name.)
  const std::string key = fmt::format(
      "kdflow calibration v4 | model {} | input {} x{} | features {} | samples {:016x} {}",
      file_digest(path), format_shape(plan.graph.input_shape), plan.graph.chunks, features,
      fnv1a_wide(std::as_bytes(samples)), samples.size());
  if (auto cached = read_calibration_cache(options, key)) return std::move(*cached);
  Replica replica(t);
  OutputBuffers out(*t);
  Calibration c;
  c.batches = samples.size() / batch_floats;
  c.samples = c.batches * static_cast<std::size_t>(t->batch());
  for (std::size_t b = 0; b < c.batches; ++b)
    replica.run(samples.data() + b * batch_floats, out.pointers);
  for (std::size_t k = 0; k < plan.observed_values.size(); ++k)
    c.ranges.emplace(plan.observed_values[k], (*plan.observed)[k]);
  c.digest = ranges_digest(c);
  write_calibration_cache(options, key, c);
  return c;
}

std::uint64_t ranges_digest(const Calibration& c) {
  std::string text;
  for (const auto& [value, range] : c.ranges)
    text += fmt::format("{} {:a} {:a}\n", value, range.first, range.second);
  return fnv1a(std::as_bytes(std::span(text.data(), text.size())));
}

LogitAgreement compare_logits(std::span<const float> reference, std::span<const float> other,
                              std::int64_t classes) {
  if (classes < 1 || reference.size() != other.size() ||
      reference.size() % static_cast<std::size_t>(classes) != 0)
    throw std::invalid_argument("compare_logits: mismatched logits");
  const auto k = static_cast<std::size_t>(classes);
  LogitAgreement a;
  a.samples = reference.size() / k;
  if (a.samples == 0) return a;
  std::size_t agree = 0;
  double kl = 0;
  for (std::size_t s = 0; s < a.samples; ++s) {
    const float* p = reference.data() + s * k;
    const float* q = other.data() + s * k;
    agree += std::max_element(p, p + k) - p == std::max_element(q, q + k) - q;
    // log-softmax of each, then sum p * (log p - log q)
    const auto log_norm = [k](const float* x) {
      const double m = *std::max_element(x, x + k);
      double z = 0;
      for (std::size_t c = 0; c < k; ++c) z += std::exp(double(x[c]) - m);
      return m + std::log(z);
    };
    const double lp = log_norm(p), lq = log_norm(q);
    for (std::size_t c = 0; c < k; ++c) {
      const double log_p = p[c] - lp, log_q = q[c] - lq;
      kl += std::exp(log_p) * (log_p - log_q);
    }
  }
  a.top1 = static_cast<double>(agree) / static_cast<double>(a.samples);
  a.kl = std::max(0.0, kl / static_cast<double>(a.samples)); // not -1e-17 for equal logits
  return a;
}

std::shared_ptr<const Teacher> Teacher::load_int8(const std::string& path, TeacherOptions options,
                                                  std::span<const float> samples,
                                                  std::span<const float> check,
                                                  const std::string& source) {
  refuse_int8_without_kernels(path);
  options.precision = Precision::int8;
  options.calibration =
      std::make_shared<const Calibration>(Teacher::calibrate(path, options, samples, source));
  auto int8 = Teacher::load(path, options);
  TeacherOptions fp32 = options;
  fp32.precision = Precision::fp32;
  fp32.tune = Tune::off;
  fp32.calibration.reset();
  fp32.prefer.clear();
  const auto reference = Teacher::load(path, fp32);
  if (check.size() != static_cast<std::size_t>(numel(reference->input_shape())))
    throw InputError(fmt::format("{}: the check batch holds {} floats, not one batch of input {}",
                                 source, check.size(), format_shape(reference->input_shape())));
  OutputBuffers want(*reference), got(*int8);
  Replica(reference).run(check.data(), want.pointers);
  Replica(int8).run(check.data(), got.pointers);
  const Shape logits = int8->output_shape(0);
  const std::int64_t classes = logits.size() > 1 ? numel(logits) / logits[0] : 1;
  int8->plan_->int8_check = compare_logits(want.data[0], got.data[0], classes);
  return int8;
}

Teacher::~Teacher() = default;
const Graph& Teacher::graph() const { return plan_->graph; }
Precision Teacher::precision() const { return plan_->precision; }
std::int64_t Teacher::batch() const { return plan_->graph.batch * plan_->graph.chunks; }
Shape Teacher::input_shape() const {
  Shape s = plan_->graph.input_shape;
  s[0] = batch();
  return s;
}
std::vector<std::string> Teacher::output_names() const {
  std::vector<std::string> out;
  for (const auto& o : plan_->outputs) out.push_back(o.name);
  return out;
}
Shape Teacher::output_shape(std::size_t k) const {
  Shape s = plan_->outputs.at(k).shape;
  if (plan_->graph.chunks > 1) s[0] = batch();
  return s;
}
std::size_t Teacher::steps() const { return plan_->steps.size(); }
std::size_t Teacher::buffer_bytes() const {
  return plan_->arena_bytes * static_cast<std::size_t>(plan_->passes_at_once);
}
std::size_t Teacher::unshared_buffer_bytes() const {
  return std::accumulate(plan_->buffer_bytes.begin(), plan_->buffer_bytes.end(), std::size_t{0});
}
std::size_t Teacher::reorders() const {
  return static_cast<std::size_t>(std::count_if(plan_->steps.begin(), plan_->steps.end(),
                                                [](const Step& s) { return s.reorder; }));
}

const TuneReport& Teacher::tune_report() const { return plan_->tune; }
const Calibration* Teacher::calibration() const {
  return plan_->precision == Precision::int8 ? plan_->calibration.get() : nullptr;
}
std::optional<LogitAgreement> Teacher::int8_check() const { return plan_->int8_check; }

std::string int8_check_warning(const LogitAgreement& check, const std::string& model) {
  const double samples = static_cast<double>(check.samples);
  const double changed = std::round((1.0 - check.top1) * samples);
  if (changed <= std::max(2.0, 0.05 * samples)) return {};
  return fmt::format("{}: int8 changed the teacher's top-1 on {:.0f} of {:.0f} check samples "
                     "(agreement {:.2f}%, KL {:.2e}): its targets are not fp32's within "
                     "quantization noise; teacher.precision = bf16 (where the CPU has it) or fp32 "
                     "keeps them",
                     model, changed, samples, 100 * check.top1, check.kl);
}

std::string describe_passes(const Teacher& t) {
  const Graph& g = t.graph();
  if (g.chunks == 1) return "the batch whole";
  const int at_once = t.tune_report().passes_at_once;
  return fmt::format("passes of {} samples, {}", g.batch,
                     at_once > 1 ? fmt::format("{} at once, each on one thread", at_once)
                                 : std::string("one at a time"));
}

std::vector<StepInfo> Teacher::step_info() const {
  const auto type_name = [](dt t) -> std::string {
    switch (t) {
    case dt::f32: return "f32";
    case dt::bf16: return "bf16";
    case dt::s32: return "s32";
    case dt::s8: return "s8";
    case dt::u8: return "u8";
    default: return "other";
    }
  };
  // Each node's last step that is not a reorder carries the node's products.
  std::map<std::string, std::size_t> last;
  for (std::size_t i = 0; i < plan_->steps.size(); ++i)
    if (!plan_->steps[i].reorder && !plan_->steps[i].node.empty()) last[plan_->steps[i].node] = i;
  std::map<std::string, const Node*> by_name;
  for (const auto& n : plan_->graph.nodes) by_name[n.name] = &n;
  const auto node_flops = [&](const std::string& name) {
    const auto it = by_name.find(name);
    const OpDef* op = it == by_name.end() ? nullptr : find_op(it->second->op);
    return op != nullptr && op->flops_per_sample != nullptr
               ? op->flops_per_sample(plan_->graph, *it->second)
               : 0.0;
  };
  // Samples a batch: the plan's own batch, run `chunks` times.
  const double samples = static_cast<double>(plan_->graph.input_shape.at(0)) *
                         static_cast<double>(plan_->graph.chunks);
  std::vector<StepInfo> out;
  for (std::size_t i = 0; i < plan_->steps.size(); ++i) {
    const Step& s = plan_->steps[i];
    double flops = 0;
    if (const auto it = last.find(s.node); it != last.end() && it->second == i) {
      flops = node_flops(s.node);
      if (const auto in = plan_->taken_in.find(s.node); in != plan_->taken_in.end())
        for (const auto& other : in->second) flops += node_flops(other);
      flops *= samples;
    }
    // A primitive's destination (a reorder's target); a kernel's last operand.
    std::string writes;
    for (const auto& [arg, ref] : s.args)
      if (!s.prim || arg == DNNL_ARG_DST || arg == DNNL_ARG_TO)
        writes = type_name(ref.md.get_data_type());
    out.push_back({s.label, s.kind,
                   s.prim                       ? impl_of(*s.prim)
                   : !s.impl.empty()            ? s.impl
                   : s.loop == KernelLoop::rows ? "plain kernel"
                                                : "reference loop",
                   writes, s.weight_levels, s.weight_pairs, s.node, s.producer, flops});
  }
  return out;
}

// --- replicas ------------------------------------------------------------------------------------

namespace {

// What one pass of the plan runs with: its intermediate buffers, scratchpad, stream and the
// operands of every step. A replica has one, or one per pass it runs at once.
struct Lane {
  struct AlignedFree {
    void operator()(std::byte* p) const { std::free(p); }
  };
  explicit Lane(const Teacher::Plan& p);

  dnnl::stream stream;
  // Every intermediate buffer, at its offset in one block (Teacher::Plan::buffer_offset).
  std::unique_ptr<std::byte, AlignedFree> arena;
  std::unique_ptr<std::byte, AlignedFree> scratch;
  memory input;                                            // handle set per run
  std::vector<std::pair<memory, std::size_t>> input_views; // other views of the input, by offset
  std::vector<memory> outputs;                             // handles set per run
  std::vector<std::unordered_map<int, memory>> args;       // per primitive step
  std::vector<std::vector<std::byte*>>
      kernel_ptrs; // per kernel step (input/output patched per run)
  std::vector<std::vector<std::pair<std::size_t, ArgRef>>> kernel_user_args;
  std::vector<float*> chunk_outputs; // per run: where the current chunk's outputs go
  std::vector<double> step_seconds;  // passes at once, timed: this lane's share

  std::byte* buffer(const Teacher::Plan& p, const ArgRef& r) const {
    return arena.get() + p.buffer_offset[static_cast<std::size_t>(r.index)] + r.offset;
  }
};

std::byte* aligned_bytes(std::size_t n) {
  constexpr std::size_t kAlign = 64;
  void* p =
      std::aligned_alloc(kAlign, std::max<std::size_t>(kAlign, (n + kAlign - 1) / kAlign * kAlign));
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(p);
}

Lane::Lane(const Teacher::Plan& p) {
  stream = dnnl::stream(p.eng);
  arena.reset(aligned_bytes(p.arena_bytes));
  scratch.reset(aligned_bytes(p.scratchpad_bytes));
  input = memory(p.input_md, p.eng, DNNL_MEMORY_NONE);
  for (const auto& o : p.outputs) outputs.push_back(memory(o.md, p.eng, DNNL_MEMORY_NONE));
  chunk_outputs.resize(p.outputs.size());
  const memory scratch_memory(
      memory::desc({static_cast<memory::dim>(p.scratchpad_bytes)}, dt::u8, memory::format_tag::a),
      p.eng, scratch.get());

  const auto resolve = [&](const ArgRef& r) -> memory {
    switch (r.kind) {
    case ArgRef::Kind::weight: return p.weights[static_cast<std::size_t>(r.index)];
    case ArgRef::Kind::input: {
      if (r.md == p.input_md && r.offset == 0) return input;
      input_views.emplace_back(memory(r.md, p.eng, DNNL_MEMORY_NONE), r.offset);
      return input_views.back().first;
    }
    case ArgRef::Kind::output: return outputs[static_cast<std::size_t>(r.index)];
    case ArgRef::Kind::buffer: return memory(r.md, p.eng, buffer(p, r));
    }
    throw std::logic_error("bad operand");
  };
  for (const auto& step : p.steps) {
    std::unordered_map<int, memory> step_args;
    std::vector<std::byte*> ptrs;
    std::vector<std::pair<std::size_t, ArgRef>> user;
    if (step.prim) {
      for (const auto& [arg, ref] : step.args) step_args.emplace(arg, resolve(ref));
      step_args.emplace(DNNL_ARG_SCRATCHPAD, scratch_memory);
    } else {
      for (std::size_t k = 0; k < step.args.size(); ++k) {
        const ArgRef& ref = step.args[k].second;
        if (ref.kind == ArgRef::Kind::buffer)
          ptrs.push_back(buffer(p, ref));
        else if (ref.kind == ArgRef::Kind::weight)
          ptrs.push_back(static_cast<std::byte*>(
              p.weights[static_cast<std::size_t>(ref.index)].get_data_handle()));
        else {
          ptrs.push_back(nullptr);
          user.emplace_back(k, ref);
        }
      }
    }
    args.push_back(std::move(step_args));
    kernel_ptrs.push_back(std::move(ptrs));
    kernel_user_args.push_back(std::move(user));
  }
}

// One run of the plan on `lane` (a teacher batch, or one pass of it), adding each step's time to
// step_seconds where given.
void run_pass(const Teacher::Plan& p, Lane& s, const float* input, std::span<float* const> outputs,
              std::span<double> step_seconds) {
  const bool timed = !step_seconds.empty();
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
      step_seconds[i] +=
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

} // namespace

struct Replica::State {
  std::vector<std::unique_ptr<Lane>> lanes;
  // Passes at once: an arena of one thread per lane, which the thread running the lane enters
  // (the plan's primitives and kernels then run on that thread alone).
  std::vector<std::unique_ptr<oneapi::tbb::task_arena>> lane_arenas;
};

OutputBuffers::OutputBuffers(const Teacher& teacher) {
  const std::size_t n = teacher.output_names().size();
  data.reserve(n);
  for (std::size_t k = 0; k < n; ++k) {
    data.emplace_back(static_cast<std::size_t>(numel(teacher.output_shape(k))));
    pointers.push_back(data.back().data());
  }
}

Replica::Replica(std::shared_ptr<const Teacher> teacher)
    : teacher_(std::move(teacher)), state_(std::make_unique<State>()) {
  const Teacher::Plan& p = teacher_->plan();
  const int lanes = p.passes_at_once > 1 ? p.passes_at_once : 1;
  for (int k = 0; k < lanes; ++k) {
    state_->lanes.push_back(std::make_unique<Lane>(p));
    if (lanes > 1) state_->lane_arenas.push_back(std::make_unique<oneapi::tbb::task_arena>(1));
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
  if (timed) std::fill(step_seconds.begin(), step_seconds.end(), 0.0);
  // The batch in passes (or a model that fixes its batch): the plan runs `chunks` times, each on
  // the next rows.
  const auto chunk_at = [](const Shape& shape, std::int64_t c) {
    return static_cast<std::size_t>(c * numel(shape));
  };
  const auto pass = [&](Lane& lane, std::int64_t c, std::span<double> seconds) {
    for (std::size_t k = 0; k < outputs.size(); ++k)
      lane.chunk_outputs[k] = outputs[k] + chunk_at(p.outputs[k].shape, c);
    run_pass(p, lane, input + chunk_at(p.graph.input_shape, c), lane.chunk_outputs, seconds);
  };
  if (s.lanes.size() == 1) {
    for (std::int64_t c = 0; c < p.graph.chunks; ++c) pass(*s.lanes[0], c, step_seconds);
    return;
  }
  // Passes at once: each lane, on whichever thread of the caller's arena takes it, runs the next
  // pass nobody has taken until none is left (an arena with fewer threads than lanes runs them in
  // turn; each pass is run once whatever the threads).
  std::atomic<std::int64_t> next{0};
  const std::size_t lanes = std::min(s.lanes.size(), static_cast<std::size_t>(p.graph.chunks));
  oneapi::tbb::parallel_for(
      std::size_t{0}, lanes,
      [&](std::size_t w) {
        Lane& lane = *s.lanes[w];
        if (timed) lane.step_seconds.assign(step_seconds.size(), 0.0);
        s.lane_arenas[w]->execute([&] {
          for (std::int64_t c = next.fetch_add(1); c < p.graph.chunks; c = next.fetch_add(1))
            pass(lane, c, timed ? std::span<double>(lane.step_seconds) : std::span<double>());
        });
      },
      oneapi::tbb::simple_partitioner());
  // A step's time: the seconds its passes took on every lane, over the lanes (their share of the
  // batch's wall time where the lanes ran side by side).
  if (timed)
    for (std::size_t w = 0; w < lanes; ++w)
      for (std::size_t i = 0; i < step_seconds.size(); ++i)
        step_seconds[i] += s.lanes[w]->step_seconds[i] / static_cast<double>(lanes);
}

} // namespace kdflow::teacher
