// Every module's version lines (all_versions.hpp).
#include "all_versions.hpp"

#include "kdflow/affinity/versions.hpp"
#include "kdflow/cpu_teacher/versions.hpp"
#include "kdflow/gpu_student/versions.hpp"

namespace kdflow::app {

VersionLines all_versions() {
  VersionLines lines = core_versions();
  for (auto more :
       {student::student_versions(), teacher::teacher_versions(), affinity::affinity_versions()})
    lines.insert(lines.end(), more.begin(), more.end());
  return lines;
}

} // namespace kdflow::app
