// Faults injected into whole training runs (in this process, through the test-only fault hook): a
// loader, a teacher replica or the student's step that throws at batch k, and a stage that stalls
// past pipeline.stall_timeout_s. Each run must end within a bounded time with an error naming the
// stage and the batch, leave its last finished checkpoint resumable, and leave no thread behind.
#include "run_folder.hpp"
#include "train.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/fault_hooks.hpp"
#include "kdflow/core/slot_ring.hpp"

#include <oneapi/tbb/global_control.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kSteps = 12;
constexpr std::uint64_t kFaultBatch = 9; // after the checkpoints of steps 4 and 8 could be saved
constexpr double kStallLimitS = 2.0;     // pipeline.stall_timeout_s of the stall runs
constexpr auto kBound = 90s;             // a failed run's whole time, start-up included

// What the hook does, and where (the hook is a plain function: its settings are globals).
enum class Kind { none, raise, stall };
std::atomic<Kind> g_kind{Kind::none};
std::atomic<fault::Site> g_site{fault::Site::loader};

void inject(fault::Site site, std::uint64_t batch, const SlotRing& ring) {
  if (site != g_site.load() || batch != kFaultBatch) return;
  switch (g_kind.load()) {
  case Kind::none: return;
  case Kind::raise: throw std::runtime_error("injected fault");
  case Kind::stall:
    // Stuck as a stage blocked on the ring is: until the ring closes.
    while (!ring.closed()) std::this_thread::sleep_for(5ms);
    return;
  }
}

// The process's threads by id, with their names, and whether each still has the process's address
// space. A thread that has left it (its task's status has no VmSize line), or whose files can no
// longer be read, is ending: the kernel wakes a joiner (or oneTBB's finalize) as the thread drops
// its address space, before it removes the task from /proc.
struct Task {
  std::string name;
  bool running = false;
};
std::map<int, Task> threads() {
  std::map<int, Task> out;
  for (const auto& entry : fs::directory_iterator("/proc/self/task")) {
    Task task;
    std::ifstream comm(entry.path() / "comm");
    std::ifstream status(entry.path() / "status");
    if (!std::getline(comm, task.name)) continue;
    for (std::string line; std::getline(status, line);)
      if (line.starts_with("VmSize:")) task.running = true;
    out[std::stoi(entry.path().filename().string())] = task;
  }
  return out;
}

// The running threads not in `before` (the caller's own left out), looked at again for up to
// `grace` while there are any (the moment between the wake and the drop of the address space).
std::map<int, std::string> newcomers(const std::map<int, Task>& before,
                                     std::chrono::milliseconds grace) {
  const int self = static_cast<int>(::gettid());
  const auto deadline = Clock::now() + grace;
  for (;;) {
    std::map<int, std::string> out;
    for (const auto& [tid, task] : threads())
      if (tid != self && task.running && !before.contains(tid)) out.emplace(tid, task.name);
    if (out.empty() || Clock::now() >= deadline) return out;
    std::this_thread::sleep_for(10ms);
  }
}

class Fault : public ::testing::Test {
protected:
  void SetUp() override {
    out_ = fs::temp_directory_path() /
           ("kdflow-fault-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fault::install(inject);
  }
  void TearDown() override {
    fault::install(nullptr);
    g_kind = Kind::none;
    // Not fs::remove_all: LibTorch carries its own std::filesystem, whose remove_all the dynamic
    // linker may bind here.
    [[maybe_unused]] const int rc = std::system(("rm -rf '" + out_.string() + "'").c_str());
  }

  [[nodiscard]] TrainArgs args(const fs::path& out, bool stall = false) const {
    TrainArgs a;
    a.out = out.string();
    a.sets = {"teacher.model=" + std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx",
              "student.arch=mlp",
              "student.width=0.25",
              "student.device=cpu",
              "data.batch_size=32",
              "ring.slots=4",
              "train.max_steps=" + std::to_string(kSteps),
              "train.checkpoint_every=4",
              "train.log_every=4",
              "train.export=off",
              "cores.elastic=false",
              "pipeline.stall_timeout_s=" + std::to_string(stall ? kStallLimitS : 600.0)};
    return a;
  }

  // One run with the fault at `site`: the StageError it ends with, checked for the stage, the
  // batch and the time it took.
  StageError failed_run(const fs::path& out, fault::Site site, Kind kind,
                        const std::string& stage) {
    g_site = site;
    g_kind = kind;
    const auto t0 = Clock::now();
    try {
      train_command(args(out, kind == Kind::stall));
    } catch (const StageError& e) {
      const auto took = Clock::now() - t0;
      EXPECT_LT(took, kBound) << e.what();
      EXPECT_EQ(e.stage(), stage) << e.what();
      EXPECT_EQ(e.batch(), kFaultBatch) << e.what();
      g_kind = Kind::none;
      return e;
    }
    g_kind = Kind::none;
    ADD_FAILURE() << "the run with a fault did not fail";
    return StageError(stage, "none");
  }

  // The fault's run twice (the second in a fresh folder): every thread the second started has
  // ended, or has left the address space on its way out (threads()), within 200 ms of its return
  // (oneTBB's workers once the scheduler is finalized; the first run started the pools that
  // outlive runs, torch's), and no kdflow thread is left at all. Then the second run's last
  // checkpoint is resumed to the end.
  void check(fault::Site site, Kind kind, const std::string& stage, const std::string& says) {
    {
      oneapi::tbb::task_scheduler_handle handle{oneapi::tbb::attach{}};
      failed_run(out_ / "first", site, kind, stage);
      EXPECT_TRUE(oneapi::tbb::finalize(handle, std::nothrow)) << "oneTBB still in use";
    }
    const auto before = threads();
    oneapi::tbb::task_scheduler_handle handle{oneapi::tbb::attach{}};
    const StageError e = failed_run(out_ / "second", site, kind, stage);
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    EXPECT_TRUE(oneapi::tbb::finalize(handle, std::nothrow)) << "oneTBB still in use";
    for (const auto& [tid, name] : newcomers(before, 200ms))
      ADD_FAILURE() << "thread " << tid << " (" << name << ") left behind";
    const int self = static_cast<int>(::gettid());
    for (const auto& [tid, task] : threads()) {
      if (tid == self || !task.running) continue;
      for (const char* ours :
           {"kd-loader", "kd-teacher", "kd-watchdog", "kd-ctl", "kd-eval", "kd-copy", "kd-dist"})
        EXPECT_FALSE(task.name.starts_with(ours))
            << "thread " << tid << " (" << task.name << ") left";
    }

    // The last finished checkpoint is intact and resumable: the run goes on to its end.
    const auto saved = list_checkpoints(out_ / "second" / "checkpoints");
    ASSERT_FALSE(saved.empty()) << "the step-4 checkpoint was finished before batch 9";
    for (const auto& entry : fs::directory_iterator(out_ / "second" / "checkpoints"))
      EXPECT_FALSE(entry.path().filename().string().find(".tmp.") != std::string::npos)
          << "a temporary left: " << entry.path();
    TrainArgs resume = args(out_ / "second");
    resume.resume = "auto";
    EXPECT_EQ(train_command(resume), kExitOk);
    const auto finished = list_checkpoints(out_ / "second" / "checkpoints");
    ASSERT_FALSE(finished.empty());
    EXPECT_EQ(finished.back().filename(), checkpoint_name("", kSteps).filename());
  }

  fs::path out_;
};

TEST_F(Fault, LoaderThrowingAtBatchKStopsTheRunNamingItAndItsCheckpointResumes) {
  check(fault::Site::loader, Kind::raise, "loader", "injected fault");
}

TEST_F(Fault, TeacherThrowingAtBatchKStopsTheRunNamingItAndItsCheckpointResumes) {
  check(fault::Site::teacher, Kind::raise, "teacher", "injected fault");
}

TEST_F(Fault, StudentStepThrowingAtBatchKStopsTheRunNamingItAndItsCheckpointResumes) {
  check(fault::Site::student, Kind::raise, "student", "injected fault");
}

TEST_F(Fault, StalledTeacherIsStoppedByTheWatchdogNamingIt) {
  check(fault::Site::teacher, Kind::stall, "teacher", "pipeline.stall_timeout_s");
}

TEST_F(Fault, StalledLoaderIsStoppedByTheWatchdogNamingIt) {
  check(fault::Site::loader, Kind::stall, "loader", "pipeline.stall_timeout_s");
}

} // namespace
} // namespace kdflow::app
