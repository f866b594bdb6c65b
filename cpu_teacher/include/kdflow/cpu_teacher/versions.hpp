// oneDNN as loaded at run time: version, CPU runtime (TBB expected) and the ISA it dispatches to
// here.
#pragma once

#include "kdflow/core/versions.hpp"

#include <string>

namespace kdflow::teacher {

struct OnednnInfo {
  std::string version;     // "3.2.0"
  std::string hash;        // git hash of the build
  std::string cpu_runtime; // "TBB", "OpenMP", "sequential", "threadpool"
  std::string isa;         // effective CPU ISA, e.g. "avx512_core_amx"
};

OnednnInfo onednn_info();

VersionLines teacher_versions();

} // namespace kdflow::teacher
