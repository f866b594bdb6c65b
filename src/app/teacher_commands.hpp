// `kdflow teacher info|infer|bench`: the oneDNN teacher on its own.
#pragma once

#include <string>
#include <vector>

namespace kdflow::app {

struct TeacherArgs {
  std::string model, input, output, json;
  int threads = 0; // 0: every allowed physical core
  int batch = 64;
  double seconds = 5.0;
  std::string precision = "fp32";
  std::vector<std::string> features;
  bool profile = false;            // bench: time each step of the plan too
  std::string tune;                // "" = auto, except for info without --plan (off)
  bool plan = false;               // info: every node's ways, their measured times and the one kept
  std::string input_size = "auto"; // info, bench: binds the height and width a model leaves open
};

int teacher_info(const TeacherArgs& args);
int teacher_infer(const TeacherArgs& args);
int teacher_bench(const TeacherArgs& args);

} // namespace kdflow::app
