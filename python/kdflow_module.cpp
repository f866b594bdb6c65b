// kdflow from Python: the commands in-process (no subprocess), through the same functions the
// kdflow executable calls (src/app), so a run, a teacher's outputs, an evaluation or an export is
// what the command line gives. python/kdflow/__init__.py is the public face; this is `_kdflow`.
//
// While a command runs the GIL is released; a training run's callback takes it back for each
// metrics line. Errors raise Python exceptions carrying the command line's one-line message:
// kdflow.InputError (a ValueError: bad input, exit 2 on the command line), KeyboardInterrupt (a run
// stopped by SIGINT/SIGTERM after its checkpoint was saved, exit 130), kdflow.Error (a
// RuntimeError: anything else, exit 1). During train(), Ctrl-C stops the run as SIGINT does.
#include "commands.hpp"
#include "stop_signals.hpp"

#include "kdflow/core/error.hpp"

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pthread.h>
#include <sched.h>

#include <array>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace kdflow;
using namespace kdflow::app;

namespace {

PyObject* g_input_error = nullptr;
PyObject* g_error = nullptr;

// The calling thread's CPUs and name, put back when it goes: a command pins the thread it runs on
// (a training run's student, a teacher) and names it, and the interpreter's thread must stay its
// own.
class KeepThread {
public:
  KeepThread()
      : saved_(pthread_getaffinity_np(pthread_self(), sizeof(cpus_), &cpus_) == 0 &&
               pthread_getname_np(pthread_self(), name_.data(), name_.size()) == 0) {}
  ~KeepThread() {
    if (!saved_) return;
    pthread_setaffinity_np(pthread_self(), sizeof(cpus_), &cpus_);
    pthread_setname_np(pthread_self(), name_.data());
  }
  KeepThread(const KeepThread&) = delete;
  KeepThread& operator=(const KeepThread&) = delete;

private:
  cpu_set_t cpus_{};
  std::array<char, 16> name_{};
  bool saved_;
};

// Runs `f` without the GIL; what it throws, as the executable's main() sorts it, raised in Python.
template <class F>
auto without_gil(F&& f) -> decltype(f()) {
  std::string message;
  PyObject* kind = nullptr;
  try {
    const KeepThread keep;
    py::gil_scoped_release release;
    return f();
  } catch (const py::error_already_set&) {
    throw;
  } catch (const InputError& e) {
    kind = g_input_error;
    message = e.what();
  } catch (const StageError& e) {
    kind = g_error;
    try {
      std::rethrow_if_nested(e);
    } catch (const InputError&) {
      kind = g_input_error;
    } catch (...) {
    }
    message = e.what();
  } catch (const Interrupted& e) {
    kind = PyExc_KeyboardInterrupt;
    message = e.what();
  } catch (const std::exception& e) {
    kind = g_error;
    message = e.what();
  }
  PyErr_SetString(kind, message.c_str());
  throw py::error_already_set();
}

// kdflow.train: the run's summary.json path (the Python side reads it).
std::string train(const std::string& config, const std::vector<std::string>& sets,
                  const std::string& out, const std::string& resume, const std::string& cores,
                  const std::optional<py::function>& callback) {
  TrainArgs args{config, sets, out, resume, cores, {}};
  // A callback that raises stops the run (its checkpoint saved) and its error is raised here.
  std::mutex failed_mutex;
  std::optional<py::error_already_set> failed;
  if (callback)
    args.on_metrics = [&](const std::string& line) {
      py::gil_scoped_acquire gil;
      try {
        (*callback)(line);
      } catch (py::error_already_set& e) {
        std::lock_guard lock(failed_mutex);
        if (!failed) failed.emplace(std::move(e));
        StopSignals::request();
      }
    };
  try {
    without_gil([&] { return train_command(args); });
  } catch (py::error_already_set&) {
    if (failed) throw std::move(*failed);
    throw;
  }
  if (failed) throw std::move(*failed);
  return (std::filesystem::path(out) / "summary.json").string();
}

// kdflow.Teacher's engine: `kdflow teacher infer`'s session, one per Python object.
class PyTeacher {
public:
  PyTeacher(const std::string& path, const std::string& precision, int threads,
            const std::vector<std::string>& features, const std::string& tune)
      : args_{.model = path,
              .threads = threads,
              .precision = precision,
              .features = features,
              .tune = tune},
        session_(std::make_unique<TeacherSession>(args_, false)) {}

  std::vector<py::array_t<float>>
  infer(const py::array_t<float, py::array::c_style | py::array::forcecast>& x) {
    teacher::NpyArray in;
    for (py::ssize_t d = 0; d < x.ndim(); ++d) in.shape.push_back(x.shape(d));
    in.data.assign(x.data(), x.data() + x.size());
    const auto outs = without_gil([&] {
      const std::lock_guard lock(mutex_);
      return session_->infer(in);
    });
    std::vector<py::array_t<float>> result;
    for (const auto& o : outs) {
      py::array_t<float> a(std::vector<py::ssize_t>(o.shape.begin(), o.shape.end()));
      std::copy(o.data.begin(), o.data.end(), a.mutable_data());
      result.push_back(std::move(a));
    }
    return result;
  }

  std::vector<std::string> output_names() {
    return without_gil([&] {
      const std::lock_guard lock(mutex_);
      return session_->output_names();
    });
  }

  std::string info() {
    return without_gil([&] {
      const std::lock_guard lock(mutex_);
      return session_->info();
    });
  }

private:
  TeacherArgs args_;
  // One call at a time (taken without the GIL, so a thread waiting here never holds it).
  std::mutex mutex_;
  std::unique_ptr<TeacherSession> session_;
};

} // namespace

PYBIND11_MODULE(_kdflow, m) {
  m.doc() = "kdflow's commands in-process (python/kdflow/__init__.py is the public module)";
  // Kept for the process's life (never destroyed after the interpreter's finalization).
  g_input_error = (new py::exception<InputError>(m, "InputError", PyExc_ValueError))->ptr();
  g_error = (new py::exception<std::runtime_error>(m, "Error", PyExc_RuntimeError))->ptr();

  m.def("train", &train, py::arg("config"), py::arg("sets"), py::arg("out"), py::arg("resume"),
        py::arg("cores"), py::arg("callback"));
  m.def(
      "eval",
      [](const std::string& model, const std::string& config, const std::vector<std::string>& sets,
         const std::string& json) {
        EvalArgs args{model, config, json, sets};
        without_gil([&] { return eval_command(args); });
      },
      py::arg("model"), py::arg("config"), py::arg("sets"), py::arg("json"));
  m.def(
      "export",
      [](const std::string& run, const std::string& out, std::int64_t step,
         const std::string& format, bool force) {
        ExportArgs args{run, out, format, step, force};
        without_gil([&] { return export_command(args); });
      },
      py::arg("run"), py::arg("out"), py::arg("step"), py::arg("format"), py::arg("force"));
  m.def(
      "cores",
      [](const std::string& config, const std::vector<std::string>& sets) {
        std::string text;
        CoresArgs args;
        args.json = true;
        args.config = config;
        args.sets = sets;
        args.print = [&](const std::string& s) { text += s; };
        without_gil([&] { return cores_command(args); });
        return text;
      },
      py::arg("config"), py::arg("sets"));
  py::class_<PyTeacher>(m, "Teacher")
      .def(py::init<const std::string&, const std::string&, int, const std::vector<std::string>&,
                    const std::string&>(),
           py::arg("path"), py::arg("precision"), py::arg("threads"), py::arg("features"),
           py::arg("tune"))
      .def("infer", &PyTeacher::infer, py::arg("x"))
      .def("output_names", &PyTeacher::output_names)
      .def("info", &PyTeacher::info);
}
