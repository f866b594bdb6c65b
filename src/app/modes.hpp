// The measuring modes bench-overlap and tune-cores share: one repetition of one mode on a run's
// plan, with a fresh pipeline (the training run's own ring and stage graphs) and a fresh student.
//   student-alone  replayed batches with synthetic logits already in the slots -> student
//   student-contended  student-alone while the teacher replicas run on their own cores on a
//                  batch of their own (no ring): the student's rate beside a busy CPU (shared
//                  caches, memory bandwidth), the ceiling the overlapped pipeline can reach
//   teacher-alone  replayed batches -> CPU teacher replicas -> drained (every teacher at once;
//                  Setup::only_teacher: one of several, on its own replicas)
//   loader-alone   loaders -> drained
//   serial-cpu     one thread: load (loader cores), teach (teacher cores), then the student step
//   colocated      loaders -> student, which runs the teacher graph on its own device (LibTorch)
//   loop           the plain distillation loop a PyTorch user writes (bench/peer_pytorch_kd.py):
//                  colocated with the loaders on every CPU of the plan (a DataLoader's workers)
//                  and, on the CPU, the student's intra-op threads on every CPU of the plan too
//                  (torch.set_num_threads over the whole machine's share): the baseline kdflow's
//                  speed-ups are stated against
//   overlapped     loaders -> CPU teacher -> student, all at once (kdflow)
//   overlapped-cached  overlapped with kd.cache filled (fill_teacher_cache): the teacher stage
//                  reads the outputs kept for the batch's samples and the loaders run on the
//                  teacher's CPUs too, as in a run's epochs 2+
#pragma once

#include "pipeline.hpp"
#include "run.hpp"

#include "kdflow/gpu_student/torch_teacher.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <memory>
#include <optional>
#include <string>

namespace kdflow::app {

enum class Mode {
  student_alone,
  student_contended,
  teacher_alone,
  loader_alone,
  serial_cpu,
  colocated,
  loop,
  overlapped,
  overlapped_cached // measured only with kd.cache (not one of kModes)
};
inline constexpr Mode kModes[] = {Mode::student_alone, Mode::student_contended, Mode::teacher_alone,
                                  Mode::loader_alone,  Mode::serial_cpu,        Mode::colocated,
                                  Mode::loop,          Mode::overlapped};

const char* mode_name(Mode m);
// Whether the student trains in this mode (the others drain the ring instead).
bool student_runs(Mode m);

// One repetition's measurements over its measured window.
struct Rep {
  double seconds = 0;
  std::uint64_t samples = 0, steps = 0;
  double student_wait_s = 0; // the student (or the drain) waiting for a ready batch
  double student_busy_s = 0; // in its steps, those waits left out (a colocated teacher counts)
  double loader_work_s = 0;  // loader bodies, their waits for a free slot left out
  double teacher_work_s = 0; // teacher bodies, their waits for a loaded batch left out
  double loader_wait_s = 0, teacher_wait_s = 0;
  double ring_ready = 0; // mean ready slots seen at each step
  std::string device;    // the student's, as the trainer names it
  // On the CPU: the student's intra-op threads and the CPUs they run on (0 and empty elsewhere).
  int student_threads = 0;
  std::string student_cpus;
  [[nodiscard]] double rate() const { return static_cast<double>(samples) / seconds; }
};

struct Setup {
  const RunInputs& run; // its plan is the one measured
  const Sampler& sampler;
  std::uint32_t slots;
  std::uint64_t warmup, steps;
  double min_seconds; // a window lasts at least this long (fast modes run more steps)
  student::TrainerOptions options;
  std::vector<student::ColocatedTeacher> colocated; // needed by the colocated mode only
  // Several teachers: teacher-alone measures this one alone (its own stage), not all at once.
  std::optional<std::size_t> only_teacher;
};

// `warmup` steps (at least a lap of the ring), then the measured window. Throws what a stage threw.
Rep run_rep(const Setup& setup, Mode mode);

// kd.cache's first epoch without a student (loaders -> teacher, its outputs kept in run.cache ->
// drained), so that overlapped-cached reads what a run's later epochs read. Nothing to do without
// a cache or with one that holds every sample (read from its file).
struct CacheFill {
  double seconds = 0;
  std::uint64_t batches = 0;     // the teacher ran for
  std::size_t samples_added = 0; // to the cache
};
CacheFill fill_teacher_cache(const Setup& setup);

} // namespace kdflow::app
