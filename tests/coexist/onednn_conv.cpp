// Teacher side of the coexistence test: the same convolution on the PyPI oneDNN (TBB runtime), with
// the primitive choosing its layouts and reorders at the edges, as the teacher engine does.
#include "conv_impls.hpp"

#include <oneapi/dnnl/dnnl.hpp>

namespace kdflow::coexist {

std::string onednn_identity() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + (v->cpu_runtime == DNNL_RUNTIME_TBB ? " TBB" : " not-TBB");
}

std::vector<float> onednn_conv(const ConvCase& cc, const std::vector<float>& src,
                               const std::vector<float>& weights) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::dims src_dims = {cc.n, cc.c, cc.h, cc.w};
  const memory::dims wei_dims = {cc.k, cc.c, cc.r, cc.r};
  const memory::dims dst_dims = {cc.n, cc.k, cc.oh(), cc.ow()};
  std::vector<float> dst(static_cast<size_t>(cc.n) * cc.k * cc.oh() * cc.ow());
  memory user_src({src_dims, dt::f32, tag::nchw}, eng, const_cast<float*>(src.data()));
  memory user_wei({wei_dims, dt::f32, tag::oihw}, eng, const_cast<float*>(weights.data()));
  memory user_dst({dst_dims, dt::f32, tag::nchw}, eng, dst.data());

  const convolution_forward::primitive_desc pd(
      eng, prop_kind::forward_inference, algorithm::convolution_direct,
      {src_dims, dt::f32, tag::any}, {wei_dims, dt::f32, tag::any}, {dst_dims, dt::f32, tag::any},
      {cc.stride, cc.stride}, {cc.pad, cc.pad}, {cc.pad, cc.pad});
  auto to_primitive_layout = [&](memory& user, const memory::desc& want) {
    if (user.get_desc() == want) return user;
    memory m(want, eng);
    reorder(user, m).execute(s, user, m);
    return m;
  };
  memory p_src = to_primitive_layout(user_src, pd.src_desc());
  memory p_wei = to_primitive_layout(user_wei, pd.weights_desc());
  memory p_dst = pd.dst_desc() == user_dst.get_desc() ? user_dst : memory(pd.dst_desc(), eng);
  convolution_forward(pd).execute(
      s, {{DNNL_ARG_SRC, p_src}, {DNNL_ARG_WEIGHTS, p_wei}, {DNNL_ARG_DST, p_dst}});
  if (p_dst != user_dst) reorder(p_dst, user_dst).execute(s, p_dst, user_dst);
  s.wait();
  return dst;
}

} // namespace kdflow::coexist
