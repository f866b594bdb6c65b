// Running the kdflow binary in a child process, as a user does, for the end-to-end tests.
#pragma once

#include "../test_scratch.hpp"

#include "kdflow/core/dataset.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

extern char** environ;

namespace kdflow_test {

namespace fs = std::filesystem;

inline fs::path fixture(const std::string& name) {
  const char* dir = std::getenv("KDFLOW_FIXTURES");
  return fs::path(dir ? dir : "fixtures") / "models" / name;
}

inline fs::path scratch(const std::string& name) {
  const fs::path p = fs::path(process_scratch("kdflow_app_test_")) / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p;
}

struct Child {
  pid_t pid = -1;
  fs::path err;
};

// `program` (argv[0] = program) with `args`, stderr and stdout into files; `env`
// ("NAME=value") beside this process's environment.
inline Child spawn_program(const std::string& program, std::vector<std::string> args,
                           const fs::path& err, const fs::path& out = "/dev/null",
                           std::vector<std::string> env = {}) {
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e); // the first of a name wins
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  Child c;
  c.err = err;
  EXPECT_EQ(posix_spawn(&c.pid, program.c_str(), &actions, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  return c;
}

inline Child spawn(std::vector<std::string> args, const fs::path& err,
                   const fs::path& out = "/dev/null", std::vector<std::string> env = {}) {
  return spawn_program(KDFLOW_BIN, std::move(args), err, out, std::move(env));
}

inline int wait_exit(const Child& c) {
  int status = 0;
  EXPECT_EQ(::waitpid(c.pid, &status, 0), c.pid);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Result {
  int code;
  std::string err;
};

inline Result run(const std::vector<std::string>& args, const fs::path& out) {
  const fs::path err = out.string() + ".stderr";
  const Child c = spawn(args, err);
  const int code = wait_exit(c);
  return {code, read_text(err)};
}

// Whether kdflow sees a GPU here (`kdflow cores --json` lists it): the student then trains on
// CUDA under student.device = auto, and the tests expect its device to say so.
inline bool gpu_visible() {
  static const bool visible = [] {
    const fs::path out = scratch("cores.json");
    const Child c = spawn({"cores", "--json"}, out.string() + ".stderr", out);
    EXPECT_EQ(wait_exit(c), 0) << read_text(out.string() + ".stderr");
    const auto cores = nlohmann::json::parse(read_text(out), nullptr, false);
    return !cores.is_discarded() && !cores["topology"]["gpus"].empty();
  }();
  return visible;
}

// The device a run reports: "cpu", or "cuda:0 (<name>)" where a GPU is visible.
inline void expect_student_device(const std::string& device) {
  if (gpu_visible())
    EXPECT_EQ(device.rfind("cuda:0 (", 0), 0u) << device;
  else
    EXPECT_EQ(device, "cpu");
}

// scripts/check_tensorboard.py over run folder `out`: its event files read back by TensorBoard's
// own EventAccumulator (the venv's) against its metrics.jsonl and config.toml, and `files` event
// files there. Its exit code (0: they agree); its report and errors in out.tensorboard.txt.
inline int check_tensorboard(const fs::path& out, int files) {
  const std::string command = std::string("'") + KD_PYTHON + "' '" + KDFLOW_SOURCE_DIR +
                              "/scripts/check_tensorboard.py' '" + out.string() + "' --files " +
                              std::to_string(files) + " >'" + out.string() +
                              ".tensorboard.txt' 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// A fast `kdflow train` into `out`: MLP student and MLP fixture teacher, `batch` per step, one
// metrics line every 5 steps, a ring of 4 slots.
inline std::vector<std::string> fast_train_args(const fs::path& out, int batch = 64) {
  return {"train",
          "--out",
          out.string(),
          "--set",
          "teacher.model=" + fixture("mlp_opset13.onnx").string(),
          "--set",
          "student.arch=mlp",
          "--set",
          "student.width=0.25",
          "--set",
          "data.batch_size=" + std::to_string(batch),
          "--set",
          "train.log_every=5",
          "--set",
          "ring.slots=4"};
}

// The first `train` and `test` samples of Debian's Fashion-MNIST as plain IDX files in `dir` (a
// real dataset small enough for a test's epochs); `shift` starts the training split that far in.
inline void write_fmnist_subset(const fs::path& dir, std::size_t train, std::size_t test,
                                std::size_t shift = 0) {
  fs::create_directories(dir);
  const auto be32 = [](std::ofstream& f, std::uint32_t v) {
    const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
    f.write(b, 4);
  };
  const auto write = [&](kdflow::Split split, const std::string& stem, std::size_t n,
                         std::size_t first) {
    const auto d =
        kdflow::Dataset::load("fashion-mnist", "/usr/share/datasets/fashion-mnist", split);
    std::ofstream images(dir / (stem + "-images-idx3-ubyte"), std::ios::binary);
    std::ofstream labels(dir / (stem + "-labels-idx1-ubyte"), std::ios::binary);
    be32(images, 0x803);
    be32(images, static_cast<std::uint32_t>(n));
    be32(images, 28);
    be32(images, 28);
    be32(labels, 0x801);
    be32(labels, static_cast<std::uint32_t>(n));
    for (std::size_t i = first; i < first + n; ++i) {
      const auto image = d.image(i);
      images.write(reinterpret_cast<const char*>(image.data()),
                   static_cast<std::streamsize>(image.size()));
      labels.put(static_cast<char>(d.label(i)));
    }
  };
  write(kdflow::Split::train, "train", train, shift);
  write(kdflow::Split::test, "t10k", test, 0);
}

// `args` with one --set per `sets` entry.
inline std::vector<std::string> with(std::vector<std::string> args,
                                     std::initializer_list<std::string> sets) {
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

// One line on stderr, naming `what`.
inline void expect_one_line_naming(const std::string& err, const std::string& what) {
  EXPECT_NE(err.find(what), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

} // namespace kdflow_test
