// Teacher subcommands. The teacher runs inside a pinned arena of --threads physical cores, as it
// does inside a training run.
#include "teacher_commands.hpp"

#include "int8_report.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/npy.hpp"
#include "kdflow/cpu_teacher/passes.hpp"
#include "kdflow/cpu_teacher/peak.hpp"
#include "kdflow/cpu_teacher/versions.hpp"

#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <barrier>
#include <cctype>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <random>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

// The first `threads` physical cores this process may use (0: all of them).
affinity::CpuList teacher_cpus(const affinity::Topology& topo, int threads) {
  affinity::CpuList cpus;
  for (const auto& core : topo.cores()) cpus.push_back(core.pus[0]);
  if (threads < 0) throw InputError(fmt::format("--threads {} must be positive", threads));
  if (threads > static_cast<int>(cpus.size()))
    throw InputError(
        fmt::format("--threads {}: this process may use {} physical cores", threads, cpus.size()));
  if (threads > 0) cpus.resize(static_cast<std::size_t>(threads));
  return cpus;
}

// --precision int8: calibrated on --calibration's samples but the last batch, which checks the
// int8 logits against fp32 (printed to stderr).
std::shared_ptr<const teacher::Teacher> load_int8(const TeacherArgs& args,
                                                  teacher::TeacherOptions opts) {
  if (args.calibration.empty())
    throw InputError("--precision int8 needs --calibration FILE.npy: real samples of the "
                     "teacher's input, at least two batches (the last is held out to check the "
                     "int8 logits against fp32)");
  const teacher::NpyArray data = teacher::read_npy(args.calibration);
  const teacher::Shape sample(data.shape.begin() + (data.shape.empty() ? 0 : 1), data.shape.end());
  const std::int64_t rows = data.shape.empty() ? 0 : data.shape[0];
  if (rows < 2 * opts.batch)
    throw InputError(fmt::format("{}: {} samples, fewer than two batches of {} (the last batch "
                                 "checks the int8 logits against fp32)",
                                 args.calibration, rows, opts.batch));
  if (!opts.sample_shape) {
    opts.sample_shape = sample;
    opts.sample_source = "--calibration";
  }
  const auto per = static_cast<std::size_t>(teacher::numel(sample));
  const auto batch = static_cast<std::size_t>(opts.batch);
  const std::size_t batches = static_cast<std::size_t>(rows) / batch - 1;
  const std::span<const float> all(data.data);
  auto t = teacher::Teacher::load_int8(args.model, opts, all.first(batches * batch * per),
                                       all.subspan(batches * batch * per, batch * per),
                                       args.calibration);
  const teacher::Shape in = t->input_shape();
  if (teacher::Shape(in.begin() + 1, in.end()) != sample)
    throw InputError(fmt::format("{}: samples of shape {}, and the teacher reads {}",
                                 args.calibration, teacher::format_shape(sample),
                                 teacher::format_shape({in.begin() + 1, in.end()})));
  const auto check = *t->int8_check();
  const teacher::Calibration& c = *t->calibration();
  fmt::print(stderr,
             "kdflow: int8 teacher calibrated on {} samples of {}{}; on the next {}: top-1 "
             "agreement with fp32 {:.2f}%, KL {:.2e}\n",
             c.samples, args.calibration,
             c.from_cache     ? fmt::format(" (ranges read back from {})", c.cache_file)
             : c.note.empty() ? std::string()
                              : " (" + c.note + ")",
             check.samples, 100 * check.top1, check.kl);
  if (const std::string w = teacher::int8_check_warning(check, args.model); !w.empty())
    fmt::print(stderr, "kdflow: warning: {}\n", w);
  return t;
}

// The command's teacher at `batch` (and, when given, the samples' shape): --precision and
// --feature as the user gave them.
std::shared_ptr<const teacher::Teacher> load(const TeacherArgs& args, std::int64_t batch,
                                             std::optional<teacher::Shape> sample_shape = {}) {
  teacher::TeacherOptions opts;
  opts.batch = batch;
  opts.precision = teacher::parse_precision(args.precision);
  opts.features = args.features;
  opts.features_source = "--feature";
  if (sample_shape) {
    opts.sample_shape = std::move(*sample_shape);
    opts.sample_source = "the input";
  } else {
    opts.sample_shape = teacher::parse_input_size(args.input_size, "--input-size");
    opts.sample_source = "--input-size";
  }
  opts.tune = args.tune.empty() ? teacher::Tune::automatic : teacher::parse_tune(args.tune);
  opts.samples_per_pass = args.samples_per_pass;
  opts.passes_at_once = args.passes_at_once;
  opts.threads = static_cast<int>(teacher_cpus(affinity::Topology::load(), args.threads).size());
  auto t = opts.precision == teacher::Precision::int8 ? load_int8(args, opts)
                                                      : teacher::Teacher::load(args.model, opts);
  if (const auto& note = t->tune_report().note; !note.empty())
    fmt::print(stderr, "kdflow: {}\n", note);
  return t;
}

// teacher.tune's outcome in a line, and with --plan every node's ways.
void print_tuning(const teacher::Teacher& t, bool every_node) {
  const auto& r = t.tune_report();
  if (r.mode == teacher::Tune::off) {
    fmt::print(
        "tuning:     off (every node runs its first way; --plan tunes and lists the ways)\n");
  } else if (r.nodes.empty()) {
    fmt::print("tuning:     nothing to choose (no node runs more than one way)\n");
  } else {
    std::size_t changed = 0;
    for (const auto& n : r.nodes) changed += n.chosen != n.options.front();
    fmt::print("tuning:     {} of {} nodes run another way than their first; {:.3f} ms per batch "
               "against {:.3f} untuned ({} plans timed{}; {})\n",
               changed, r.nodes.size(), r.tuned_ms, r.untuned_ms, r.plans_timed,
               r.from_cache ? ", read from the cache" : fmt::format(" in {:.1f} s", r.seconds),
               r.cache_file.empty() ? "not cached" : r.cache_file);
  }
  if (!r.pass_ms.empty() || !r.pass_at_once_ms.empty()) {
    std::string timed;
    for (const auto& [n, ms] : r.pass_ms)
      timed += fmt::format("{}{} samples {:.3f} ms", timed.empty() ? "" : ", ", n, ms);
    for (const auto& [n, ms] : r.pass_at_once_ms)
      timed += fmt::format("{}{} samples at once {:.3f} ms", timed.empty() ? "" : ", ", n, ms);
    fmt::print("passes:     {} ({} per batch as timed)\n", teacher::describe_passes(t), timed);
  }
  if (!every_node) return;
  fmt::print("plan (node: way ms per batch ..., * kept):\n");
  for (const auto& n : r.nodes) {
    std::string ways;
    for (std::size_t k = 0; k < n.options.size(); ++k)
      ways += fmt::format(" {}{} {}", n.options[k] == n.chosen ? "*" : "", n.options[k],
                          k < n.ms.size() && n.ms[k] >= 0 ? fmt::format("{:.3f}", n.ms[k]) : "-");
    fmt::print("  {:<40}{}\n", n.node.substr(0, 40), ways);
  }
}

} // namespace

// Everything a command needs to run one replica on --threads pinned physical cores: the arena, the
// calling thread bound to the same CPUs (it joins the arena in execute()), and output buffers.
// `whole_process`: the command owns the process, and oneTBB's pool is capped at the arena's size
// for as long as this lives (a Python Teacher leaves the process's pool as it is).
struct PinnedRun {
  PinnedRun(const std::shared_ptr<const teacher::Teacher>& t, int threads,
            bool whole_process = true)
      : PinnedRun(t, affinity::Topology::load(), threads, whole_process) {}
  // On `cpus` (of `topo`), its threads named from kd-teacher-<first_index>.
  PinnedRun(const std::shared_ptr<const teacher::Teacher>& t, affinity::Topology topology,
            affinity::CpuList on, bool whole_process, int first_index = 0)
      : topo(std::move(topology)), cpus(std::move(on)), arena(topo, cpus, "teacher", first_index),
        replica(t) {
    init(t, whole_process);
  }
  // One batch, the calling thread bound to the teacher's CPUs (again: a Python caller's binding is
  // put back between calls).
  void run(const float* input) {
    affinity::pin_this_thread(topo, cpus, "kd-teacher");
    arena.arena().execute([&] { replica.run(input, outs->pointers); });
  }

  affinity::Topology topo;
  affinity::CpuList cpus;
  std::optional<oneapi::tbb::global_control> parallelism;
  affinity::PinnedArena arena;
  teacher::Replica replica;
  std::optional<teacher::OutputBuffers> outs;

private:
  PinnedRun(const std::shared_ptr<const teacher::Teacher>& t, affinity::Topology topology,
            int threads, bool whole_process)
      : topo(std::move(topology)), cpus(teacher_cpus(topo, threads)), arena(topo, cpus, "teacher"),
        replica(t) {
    init(t, whole_process);
  }
  void init(const std::shared_ptr<const teacher::Teacher>& t, bool whole_process) {
    if (whole_process)
      parallelism.emplace(oneapi::tbb::global_control::max_allowed_parallelism, cpus.size() + 1);
    affinity::pin_this_thread(topo, cpus, "kd-teacher");
    outs.emplace(*t); // first touched on the pinned CPUs
  }
};

namespace {

// Median time of every step over profiled batches (each step waited for before the next starts),
// and their sums by kind: where a batch's time goes. A step that computes products (StepInfo::
// flops) also says at what rate, and what share of `peak_gflops` (the FMA peak of the bench's
// threads) that is: which steps run far below what the CPU can do.
nlohmann::json step_profile(PinnedRun& pinned, const teacher::Teacher& t, const float* input,
                            double seconds, double peak_gflops) {
  const std::size_t steps = t.steps();
  std::vector<std::vector<double>> samples(steps);
  std::vector<double> one(steps);
  const auto start = std::chrono::steady_clock::now();
  std::size_t batches = 0;
  while (batches < 5 ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
             seconds) {
    pinned.replica.run_timed(input, pinned.outs->pointers, one);
    for (std::size_t i = 0; i < steps; ++i) samples[i].push_back(one[i]);
    ++batches;
  }
  const auto info = t.step_info();
  double total = 0;
  std::map<std::string, std::pair<int, double>> kinds; // kind -> (steps, seconds)
  std::map<std::string, double> kind_flops;            // kind -> the products of its steps
  // GFLOP/s of `flops` in `s` seconds, and that over the peak; null where there are none.
  const auto rate = [](double flops, double s) {
    return flops > 0 && s > 0 ? nlohmann::json(flops / s / 1e9) : nlohmann::json(nullptr);
  };
  const auto peak_share = [&](double flops, double s) {
    return flops > 0 && s > 0 && peak_gflops > 0 ? nlohmann::json(flops / s / 1e9 / peak_gflops)
                                                 : nlohmann::json(nullptr);
  };
  // kind -> steps that ran as kdflow's own code (plain kernels or reference loops), and as
  // reference loops
  std::map<std::string, int> plain_n, reference_n;
  // kind -> steps of kdflow's that run oneDNN primitives themselves (Winograd: kdflow's
  // transforms around oneDNN's matmul)
  std::map<std::string, int> composite_n, own_n;
  double plain_total = 0, reference_total = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < steps; ++i) {
    auto& v = samples[i];
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    const double median = v[v.size() / 2];
    total += median;
    kinds[info[i].kind].first += 1;
    kinds[info[i].kind].second += median;
    kind_flops[info[i].kind] += info[i].flops;
    const bool reference = info[i].impl == "reference loop";
    if (reference || info[i].impl == "plain kernel") {
      plain_n[info[i].kind] += 1;
      plain_total += median;
    }
    // kdflow's kernels: around oneDNN primitives ("kdflow winograd ... + brg_matmul:...") or
    // vectorized on their own ("kdflow planar->channels-last ...").
    if (info[i].impl.starts_with("kdflow "))
      (info[i].impl.find(" + ") != std::string::npos ? composite_n : own_n)[info[i].kind] += 1;
    if (reference) {
      reference_n[info[i].kind] += 1;
      reference_total += median;
    }
    rows.push_back({{"label", info[i].label},
                    {"kind", info[i].kind},
                    {"impl", info[i].impl},
                    {"writes", info[i].writes},
                    {"weight_levels", info[i].weight_levels},
                    {"weight_pairs", info[i].weight_pairs},
                    {"node", info[i].node},
                    {"producer", info[i].producer},
                    {"ms", median * 1e3},
                    {"flops", info[i].flops},
                    {"gflops_per_s", rate(info[i].flops, median)},
                    {"peak_share", peak_share(info[i].flops, median)}});
  }
  std::vector<std::pair<std::string, std::pair<int, double>>> by_kind(kinds.begin(), kinds.end());
  std::sort(by_kind.begin(), by_kind.end(),
            [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  nlohmann::json kind_rows = nlohmann::json::array();
  for (const auto& [kind, v] : by_kind) {
    // How the kind ran: oneDNN primitives, kdflow's kernels around oneDNN primitives, kdflow's
    // vectorized kernels of their own, its plain kernels, its reference loops, or a mix.
    const int plain = plain_n.count(kind) ? plain_n.at(kind) : 0;
    const int reference = reference_n.count(kind) ? reference_n.at(kind) : 0;
    const int composite = composite_n.count(kind) ? composite_n.at(kind) : 0;
    const int own = own_n.count(kind) ? own_n.at(kind) : 0;
    const char* ran = composite == v.first                       ? "kdflow + oneDNN"
                      : own == v.first                           ? "kdflow kernel"
                      : plain == 0 && composite == 0 && own == 0 ? "oneDNN"
                      : plain == v.first && reference == 0       ? "plain kernel"
                      : plain == v.first && reference == v.first ? "reference loop"
                                                                 : "mixed";
    kind_rows.push_back({{"kind", kind},
                         {"steps", v.first},
                         {"ms", v.second * 1e3},
                         {"share", total > 0 ? v.second / total : 0.0},
                         {"ran", ran},
                         {"flops", kind_flops[kind]},
                         {"gflops_per_s", rate(kind_flops[kind], v.second)},
                         {"peak_share", peak_share(kind_flops[kind], v.second)}});
  }
  return {{"batches", batches},
          {"step_ms_sum", total * 1e3},
          {"plain_kernel_share", total > 0 ? plain_total / total : 0.0},
          {"reference_share", total > 0 ? reference_total / total : 0.0},
          {"by_kind", kind_rows},
          {"steps", rows}};
}

void print_profile(const nlohmann::json& profile) {
  fmt::print("where the time goes: {} steps, {:.3f} ms summed (medians of {} batches)\n",
             profile["steps"].size(), profile["step_ms_sum"].get<double>(),
             profile["batches"].get<std::size_t>());
  for (const auto& k : profile["by_kind"])
    fmt::print("  {:<20} {:>4} steps {:>9.3f} ms {:>5.1f}%  {:<16}{}\n",
               k["kind"].get<std::string>(), k["steps"].get<int>(), k["ms"].get<double>(),
               100 * k["share"].get<double>(), k["ran"].get<std::string>(),
               k["peak_share"].is_null() ? std::string()
                                         : fmt::format("{:.1f} GFLOP/s, {:.0f}% of the peak",
                                                       k["gflops_per_s"].get<double>(),
                                                       100 * k["peak_share"].get<double>()));
  fmt::print("plain kernels (kdflow's own loops, not oneDNN primitives): {:.1f}% of the time, "
             "reference loops (element by element) among them: {:.1f}%\n",
             100 * profile["plain_kernel_share"].get<double>(),
             100 * profile["reference_share"].get<double>());
}

// The file beside `output` (x.npy) for the teacher's output `value`: x.<value>.npy, the value's
// name made a file name (ONNX names such as "/layer1/Relu_output_0" hold slashes).
std::string beside(const std::string& output, const std::string& value) {
  std::string name;
  for (const char c : value)
    name += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  const auto dot = output.rfind(".npy");
  return (dot == std::string::npos ? output : output.substr(0, dot)) + "." + name + ".npy";
}

// Every value of the graph as imported (before kdflow's passes, which keep the ones named as
// features): what teacher.features and --feature can name.
void print_values(const TeacherArgs& args) {
  teacher::LoadOptions options;
  options.batch = args.batch;
  options.sample_shape = teacher::parse_input_size(args.input_size, "--input-size");
  options.sample_source = "--input-size";
  options.run_passes = false;
  const teacher::Graph g = teacher::load_onnx(args.model, options);
  std::size_t count = 0;
  std::string rows;
  for (const auto& node : g.nodes)
    for (const auto& value : node.outputs) {
      if (value.empty() || !g.shapes.count(value)) continue;
      const teacher::Shape& s = g.shape(value);
      const bool per_sample = !s.empty() && s[0] == g.batch;
      count += per_sample;
      rows += fmt::format("  {} {} ({}){}\n", value, teacher::format_shape(s), node.op,
                          per_sample ? "" : ": not one row per sample, cannot be a feature");
    }
  fmt::print("values (teacher.features or --feature name any of these {}; shapes at batch {}):\n{}",
             count, g.batch, rows);
}

} // namespace

int teacher_info(const TeacherArgs& args) {
  TeacherArgs info = args;
  if (info.tune.empty()) info.tune = info.plan ? "auto" : "off";
  const auto t = load(info, args.batch);
  const auto& g = t->graph();
  const auto s = teacher::summarize(g);
  fmt::print("model:      {} (opset {})\n", g.file, g.opset);
  fmt::print("input:      {} {}\n", g.input, teacher::format_shape(t->input_shape()));
  if (g.chunks > 1 && t->tune_report().samples_per_pass > 0)
    fmt::print("batch:      {} samples in {} (the tuner's or --samples-per-pass: a smaller "
               "working set)\n",
               t->batch(), teacher::describe_passes(*t));
  else if (g.chunks > 1)
    fmt::print("batch:      {} runs of {} per batch: the model fixes its batch at {} (export it "
               "with a dynamic batch dimension to run a batch at once)\n",
               g.chunks, g.batch, g.batch);
  for (std::size_t k = 0; k < t->output_names().size(); ++k)
    fmt::print("output:     {} {}\n", t->output_names()[k],
               teacher::format_shape(t->output_shape(k)));
  fmt::print("nodes:      {} after passes ({} fused post-ops)\n", s.nodes, s.fused_post_ops);
  fmt::print("parameters: {}\n", s.parameters);
  fmt::print("FLOPs:      {:.3f} M per sample\n", s.flops_per_sample / 1e6);
  fmt::print("plan:       {} steps at batch {} ({} reorders), precision {}\n", t->steps(),
             t->batch(), t->reorders(), teacher::precision_name(t->precision()));
  fmt::print("memory:     {:.1f} MiB of intermediate tensors per replica ({:.1f} MiB were none "
             "shared)\n",
             static_cast<double>(t->buffer_bytes()) / (1 << 20),
             static_cast<double>(t->unshared_buffer_bytes()) / (1 << 20));
  print_tuning(*t, args.plan);
  fmt::print("graph after passes:\n{}", teacher::describe_graph(g));
  print_values(args);
  return 0;
}

struct TeacherSession::Loaded {
  teacher::Shape input;
  std::shared_ptr<const teacher::Teacher> teacher;
  PinnedRun pinned;
};

TeacherSession::TeacherSession(TeacherArgs args, bool whole_process)
    : args_(std::move(args)), whole_process_(whole_process) {}
TeacherSession::~TeacherSession() = default;

std::vector<teacher::NpyArray> TeacherSession::infer(const teacher::NpyArray& x) {
  const std::string& what = args_.input.empty() ? std::string("the input") : args_.input;
  if (x.shape.size() < 2)
    throw InputError(fmt::format("{}: needs a batch dimension, has shape {}", what,
                                 teacher::format_shape(x.shape)));
  if (x.data.size() != static_cast<std::size_t>(teacher::numel(x.shape)))
    throw InputError(fmt::format("{}: {} values for shape {}", what, x.data.size(),
                                 teacher::format_shape(x.shape)));
  if (!loaded_ || loaded_->input != x.shape) {
    loaded_.reset();
    auto t = load(args_, x.shape[0], teacher::Shape(x.shape.begin() + 1, x.shape.end()));
    loaded_.reset(new Loaded{x.shape, t, PinnedRun(t, args_.threads, whole_process_)});
  }
  PinnedRun& pinned = loaded_->pinned;
  pinned.run(x.data.data());
  std::vector<teacher::NpyArray> out;
  for (std::size_t k = 0; k < pinned.outs->data.size(); ++k)
    out.push_back({loaded_->teacher->output_shape(k), pinned.outs->data[k]});
  return out;
}

std::vector<std::string> TeacherSession::output_names() {
  if (!loaded_) {
    auto t = load(args_, args_.batch);
    return t->output_names();
  }
  return loaded_->teacher->output_names();
}

std::string TeacherSession::info() {
  const auto t = loaded_ ? loaded_->teacher : load(args_, args_.batch);
  const auto& g = t->graph();
  const auto s = teacher::summarize(g);
  nlohmann::json outputs = nlohmann::json::array();
  for (std::size_t k = 0; k < t->output_names().size(); ++k)
    outputs.push_back({{"name", t->output_names()[k]}, {"shape", t->output_shape(k)}});
  return nlohmann::json{{"model", g.file},
                        {"opset", g.opset},
                        {"input", g.input},
                        {"input_shape", t->input_shape()},
                        {"outputs", outputs},
                        {"nodes", s.nodes},
                        {"parameters", s.parameters},
                        {"flops_per_sample", s.flops_per_sample},
                        {"steps", t->steps()},
                        {"precision", teacher::precision_name(t->precision())}}
      .dump();
}

int teacher_infer(const TeacherArgs& args) {
  TeacherSession session(args);
  const auto outs = session.infer(teacher::read_npy(args.input));
  const auto names = session.output_names();
  teacher::write_npy(args.output, outs[0].shape, outs[0].data.data());
  for (std::size_t k = 1; k < outs.size(); ++k)
    teacher::write_npy(beside(args.output, names[k]), outs[k].shape, outs[k].data.data());
  return 0;
}

// A batch of standard normal values for `t`, the same in every bench.
std::vector<float> bench_input(const teacher::Teacher& t) {
  std::vector<float> input(static_cast<std::size_t>(teacher::numel(t.input_shape())));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (auto& v : input) v = dist(rng);
  return input;
}

// Inside the run's arena: three batches to warm up (JIT, caches, pages).
void warm_up(PinnedRun& pinned, const float* input) {
  for (int i = 0; i < 3; ++i) pinned.replica.run(input, pinned.outs->pointers);
}

// Inside the run's arena: batches back to back for `seconds` (at least 5), each one's time.
std::vector<double> time_batches(PinnedRun& pinned, const float* input, double seconds) {
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  const auto since = [](std::chrono::steady_clock::time_point from) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
  };
  while (since(start) < seconds || times.size() < 5) {
    const auto t0 = std::chrono::steady_clock::now();
    pinned.replica.run(input, pinned.outs->pointers);
    times.push_back(since(t0));
  }
  return times;
}

// The FMA peak of the current arena's threads, measured for a quarter of the bench's window
// (0.5 to 2 s).
teacher::PeakResult fma_peak(double bench_seconds) {
  return teacher::measure_fma_peak(std::min(2.0, std::max(0.5, bench_seconds / 4)));
}

// What every `teacher bench` result says: the model, its rate and FLOP rate against the measured
// peak, the ISA and precision, the batch, the FLOPs per sample, the features, oneDNN and the
// tuning.
nlohmann::json bench_result(const TeacherArgs& args, const teacher::Teacher& t, double images,
                            const teacher::PeakResult& peak) {
  const auto summary = teacher::summarize(t.graph());
  const double gflops = images * summary.flops_per_sample / 1e9;
  const auto info = teacher::onednn_info();
  const auto& tuned = t.tune_report();
  nlohmann::json int8 = int8_report(t, args.model);
  if (!int8.is_null()) int8["calibration"] = args.calibration;
  // Each node with more than one way: the one the plan runs, and what the tuner measured for
  // each (ms per batch: the node's own steps, reorders it asked for included; null where the
  // tuner did not time that way: an untuned plan, or a node another way took in).
  nlohmann::json ways = nlohmann::json::array();
  for (const auto& n : tuned.nodes) {
    nlohmann::json ms = nlohmann::json::object();
    for (std::size_t k = 0; k < n.options.size(); ++k)
      ms[n.options[k]] = k < n.ms.size() && n.ms[k] >= 0 ? nlohmann::json(n.ms[k]) : nullptr;
    ways.push_back({{"node", n.node}, {"chosen", n.chosen}, {"ms", std::move(ms)}});
  }
  return {
      {"tune",
       {{"mode", teacher::tune_name(tuned.mode)},
        {"from_cache", tuned.from_cache},
        {"untuned_ms", tuned.untuned_ms},
        {"tuned_ms", tuned.tuned_ms},
        {"plans_timed", tuned.plans_timed},
        {"samples_per_pass", tuned.samples_per_pass},
        {"passes_at_once", tuned.passes_at_once},
        {"pass_ms", tuned.pass_ms},
        {"pass_at_once_ms", tuned.pass_at_once_ms},
        {"seconds", tuned.seconds},
        {"nodes", tuned.nodes.size()},
        {"ways", std::move(ways)}}},
      {"model", args.model},
      {"images_per_s", images},
      {"gflops_per_s", gflops},
      {"peak_gflops_per_s", peak.gflops_per_s},
      {"peak_fraction", peak.gflops_per_s > 0 ? gflops / peak.gflops_per_s : 0.0},
      {"peak_isa", peak.isa},
      {"isa", info.isa},
      {"precision", args.precision},
      {"native_bf16", teacher::has_native_bf16()},
      {"native_int8", teacher::has_native_int8()},
      {"int8_weight_levels", teacher::int8_weight_levels()},
      {"int8", int8},
      {"batch", args.batch},
      {"flops_per_sample", summary.flops_per_sample},
      {"features", args.features},
      {"onednn", info.version + " " + info.cpu_runtime},
  };
}

// --json: the result written whole or not at all.
void write_result(const std::string& path, const nlohmann::json& result) {
  if (path.empty()) return;
  try {
    write_file_atomic(path, result.dump(2) + "\n");
  } catch (const std::system_error& e) {
    throw InputError(fmt::format("{}: cannot write ({})", path, e.code().message()));
  }
}

// --replicas R: R replicas of --threads each on their own physical cores (the first R x threads),
// all running the same batch at once from a common start, as a training run's teacher stage runs
// a plan's replicas: their images/s together (each replica's batches over its own window), the
// slowest replica's median batch time, and the FMA peak of all their cores together.
int teacher_bench_replicas(const TeacherArgs& args) {
  if (args.profile)
    throw InputError(
        fmt::format("--profile times one replica's steps: not with --replicas {}", args.replicas));
  auto topo = affinity::Topology::load();
  const int cores = static_cast<int>(teacher_cpus(topo, 0).size());
  const int threads = args.threads > 0 ? args.threads : cores / args.replicas;
  if (threads < 1 || static_cast<std::int64_t>(threads) * args.replicas > cores)
    throw InputError(fmt::format("--replicas {} x --threads {}: this process may use {} physical "
                                 "cores",
                                 args.replicas, args.threads, cores));
  TeacherArgs one = args;
  one.threads = threads;
  const auto t = load(one, args.batch);
  const affinity::CpuList all = teacher_cpus(topo, threads * args.replicas);
  const oneapi::tbb::global_control parallelism(
      oneapi::tbb::global_control::max_allowed_parallelism, all.size() + 1);
  const std::vector<float> input = bench_input(*t);

  const auto n = static_cast<std::size_t>(args.replicas);
  std::vector<std::vector<double>> times(n);
  std::vector<double> windows(n);
  std::vector<std::exception_ptr> failed(n);
  std::barrier start(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> workers;
  for (std::size_t r = 0; r < n; ++r)
    workers.emplace_back([&, r] {
      bool arrived = false;
      try {
        const auto from = all.begin() + static_cast<std::ptrdiff_t>(r) * threads;
        PinnedRun pinned(t, affinity::Topology::load(), affinity::CpuList(from, from + threads),
                         false, static_cast<int>(r) * threads);
        pinned.arena.arena().execute([&] {
          warm_up(pinned, input.data());
          arrived = true;
          start.arrive_and_wait();
          const auto begin = std::chrono::steady_clock::now();
          times[r] = time_batches(pinned, input.data(), args.seconds);
          windows[r] =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
        });
      } catch (...) {
        failed[r] = std::current_exception();
        if (!arrived) start.arrive_and_drop(); // the others do not wait for a replica that failed
      }
    });
  for (auto& w : workers) w.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);

  double images = 0, slowest = 0;
  std::size_t timed = 0;
  nlohmann::json each = nlohmann::json::array();
  for (std::size_t r = 0; r < n; ++r) {
    auto& v = times[r];
    std::sort(v.begin(), v.end());
    const double rate =
        static_cast<double>(v.size()) * static_cast<double>(args.batch) / windows[r];
    images += rate;
    slowest = std::max(slowest, v[v.size() / 2]);
    timed += v.size();
    each.push_back({{"images_per_s", rate},
                    {"median_batch_ms", v[v.size() / 2] * 1e3},
                    {"batches_timed", v.size()}});
  }
  teacher::PeakResult peak;
  {
    affinity::PinnedArena arena(topo, all, "teacher");
    affinity::pin_this_thread(topo, all, "kd-teacher");
    arena.arena().execute([&] { peak = fma_peak(args.seconds); });
  }
  nlohmann::json result = bench_result(args, *t, images, peak);
  result["replicas"] = args.replicas;
  result["threads"] = threads;
  result["cpus"] = all;
  result["median_batch_ms"] = slowest * 1e3;
  result["batches_timed"] = timed;
  result["per_replica"] = each;
  const double gflops = result["gflops_per_s"].get<double>();
  const auto info = teacher::onednn_info();
  fmt::print("{}: {:.1f} images/s from {} replicas x {} thread(s), {:.1f} GFLOP/s = {:.0f}% of the "
             "{:.1f} GFLOP/s FMA peak of their {} cores ({} {}, batch {}, slowest replica's "
             "median batch {:.2f} ms)\n",
             args.model, images, args.replicas, threads, gflops,
             100 * result["peak_fraction"].get<double>(), peak.gflops_per_s, all.size(),
             args.precision, info.isa, args.batch, slowest * 1e3);
  write_result(args.json, result);
  return 0;
}

int teacher_bench(const TeacherArgs& args) {
  if (args.batch < 1) throw InputError(fmt::format("--batch {} must be at least 1", args.batch));
  if (args.seconds <= 0)
    throw InputError(fmt::format("--seconds {} must be positive", args.seconds));
  if (args.replicas < 1)
    throw InputError(fmt::format("--replicas {} must be at least 1", args.replicas));
  if (args.replicas > 1) return teacher_bench_replicas(args);
  const auto t = load(args, args.batch);
  PinnedRun pinned(t, args.threads);
  const std::vector<float> input = bench_input(*t);
  std::vector<double> times;
  teacher::PeakResult peak;
  nlohmann::json profile;
  pinned.arena.arena().execute([&] {
    warm_up(pinned, input.data());
    times = time_batches(pinned, input.data(), args.seconds);
    peak = fma_peak(args.seconds);
    if (args.profile)
      profile = step_profile(pinned, *t, input.data(), args.seconds / 2, peak.gflops_per_s);
  });
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double images = static_cast<double>(args.batch) / median;
  nlohmann::json result = bench_result(args, *t, images, peak);
  result["threads"] = pinned.cpus.size();
  result["cpus"] = pinned.cpus;
  result["median_batch_ms"] = median * 1e3;
  result["batches_timed"] = times.size();
  const double gflops = result["gflops_per_s"].get<double>();
  const auto info = teacher::onednn_info();
  fmt::print("{}: {:.1f} images/s, {:.1f} GFLOP/s = {:.0f}% of the {:.1f} GFLOP/s FMA peak ({} {}, "
             "batch {}, {} thread(s), "
             "median of {} batches {:.2f} ms)\n",
             args.model, images, gflops, 100 * result["peak_fraction"].get<double>(),
             peak.gflops_per_s, args.precision, info.isa, args.batch, pinned.cpus.size(),
             times.size(), median * 1e3);
  if (args.profile) {
    print_profile(profile);
    result["profile"] = profile;
  }
  write_result(args.json, result);
  return 0;
}

} // namespace kdflow::app
