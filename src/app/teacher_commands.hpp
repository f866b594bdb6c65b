// `kdflow teacher info|infer|bench`: the oneDNN teacher on its own.
#pragma once

#include "kdflow/cpu_teacher/npy.hpp"

#include <memory>
#include <string>
#include <vector>

namespace kdflow::app {

struct TeacherArgs {
  std::string model, input, output, json;
  int threads = 0; // 0: every allowed physical core
  int batch = 64;
  double seconds = 5.0;
  std::string precision = "fp32";
  std::string calibration; // int8: .npy of real samples of the teacher's input
  std::vector<std::string> features;
  bool profile = false;            // bench: time each step of the plan too
  std::string tune;                // "" = auto, except for info without --plan (off)
  bool plan = false;               // info: every node's ways, their measured times and the one kept
  std::string input_size = "auto"; // info, bench: binds the height and width a model leaves open
  int replicas = 1; // bench: this many replicas of --threads each, on their own cores, at once
  int samples_per_pass = 0; // info, bench: the batch in passes of this many (0: the tuner's choice)
  int passes_at_once = 0;   // info, bench: passes run at once, one per thread (0: the tuner's)
};

// A teacher as `kdflow teacher infer` runs it (the same load, pinned arena and replica), kept
// between batches: what teacher_infer and kdflow's Python Teacher run. A batch of another size
// loads the model again at that size. A call binds and names the calling thread as the teacher's
// (kdflow's Python module puts its thread back). `whole_process` (the command line): oneTBB's
// pool is capped at the teacher's CPUs while the session lives; a Python Teacher leaves it be.
// Not for several threads at once.
class TeacherSession {
public:
  explicit TeacherSession(TeacherArgs args, bool whole_process = true);
  ~TeacherSession();
  TeacherSession(const TeacherSession&) = delete;
  TeacherSession& operator=(const TeacherSession&) = delete;

  // The teacher's outputs for `x` (batch first; the samples' shape binds what the model leaves
  // open), its logits first, then each --feature's value.
  std::vector<teacher::NpyArray> infer(const teacher::NpyArray& x);
  // Each output's name, in infer()'s order (after a first infer(), or at --batch before).
  std::vector<std::string> output_names();
  // What `teacher info` says first, as JSON text: the model, its input and outputs with their
  // shapes, parameters, FLOPs per sample, the plan's steps and precision (at the last infer()'s
  // batch, or --batch before).
  std::string info();

private:
  struct Loaded;
  TeacherArgs args_;
  bool whole_process_;
  std::unique_ptr<Loaded> loaded_;
};

int teacher_info(const TeacherArgs& args);
int teacher_infer(const TeacherArgs& args);
int teacher_bench(const TeacherArgs& args);

} // namespace kdflow::app
