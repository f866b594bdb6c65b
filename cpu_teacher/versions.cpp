// Reads oneDNN's run-time version, CPU runtime and effective ISA.
#include "kdflow/cpu_teacher/versions.hpp"

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace kdflow::teacher {
namespace {

std::string runtime_name(unsigned runtime) {
  switch (runtime) {
  case DNNL_RUNTIME_TBB: return "TBB";
  case DNNL_RUNTIME_OMP: return "OpenMP";
  case DNNL_RUNTIME_SEQ: return "sequential";
  case DNNL_RUNTIME_THREADPOOL: return "threadpool";
  default: return fmt::format("runtime {:#x}", runtime);
  }
}

std::string isa_name(dnnl::cpu_isa isa) {
  using I = dnnl::cpu_isa;
  switch (isa) {
  case I::sse41: return "sse41";
  case I::avx: return "avx";
  case I::avx2: return "avx2";
  case I::avx2_vnni: return "avx2_vnni";
  case I::avx2_vnni_2: return "avx2_vnni_2";
  case I::avx512_core: return "avx512_core";
  case I::avx512_core_vnni: return "avx512_core_vnni";
  case I::avx512_core_bf16: return "avx512_core_bf16";
  case I::avx512_core_fp16: return "avx512_core_fp16";
  case I::avx512_core_amx: return "avx512_core_amx";
  case I::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
  default: return fmt::format("isa {:#x}", static_cast<unsigned>(isa));
  }
}

} // namespace

OnednnInfo onednn_info() {
  const dnnl_version_t* v = dnnl_version();
  return {fmt::format("{}.{}.{}", v->major, v->minor, v->patch), v->hash,
          runtime_name(v->cpu_runtime), isa_name(dnnl::get_effective_cpu_isa())};
}

VersionLines teacher_versions() {
  const OnednnInfo info = onednn_info();
  return {{"oneDNN", fmt::format("{} (git {}), CPU runtime {}, ISA {}", info.version,
                                 info.hash.substr(0, 12), info.cpu_runtime, info.isa)}};
}

} // namespace kdflow::teacher
