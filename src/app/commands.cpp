// Registers every subcommand of docs/DESIGN.md. Each one's action is set by its callback, so run()
// only calls what the user chose.
#include "commands.hpp"

#include "kdflow/cpu_teacher/precision_names.hpp"

#include "run.hpp"

#include "kdflow/affinity/plan.hpp"
#include "kdflow/affinity/versions.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/versions.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

namespace kdflow::app {
namespace {

int print_versions() {
  VersionLines lines = all_versions();
  // What kind of memory a slot ring would get here (pinned for the GPU, mlocked, or pageable).
  const HostMemory probe = student::allocate_pinned_for_device(1 << 20);
  lines.emplace_back("ring", fmt::format("{} host memory", memory_kind_name(probe.kind())));
  for (const auto& [name, text] : lines) fmt::print("{:<9} {}\n", name + ":", text);
  return kExitOk;
}

// A number of seconds: finite and above 0 (`zero`: at least 0). NaN and infinity are refused.
CLI::Validator seconds(bool zero) {
  return {[zero](std::string& text) -> std::string {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < 0 ||
                (v == 0 && !zero))
              return fmt::format("'{}' is not a number of seconds {} 0", text,
                                 zero ? "of at least" : "above");
            return {};
          },
          zero ? "SECONDS>=0" : "SECONDS>0"};
}

} // namespace

Commands::Commands(CLI::App& app) : app_(app) {
  app.add_flag("--version", version_, "print the versions of kdflow and every library it loaded");
  app.require_subcommand(0, 1);
  app.fallthrough(false);

  add_train(app);
  add_eval(app);
  add_data(app);
  add_export(app);
  add_teacher(app);
  add_cores(app);
  add_tune(app);
  add_overlap(app);
  add_report(app);
}

void Commands::add_report(CLI::App& app) {
  auto* report = app.add_subcommand(
      "report", "plots of training runs (loss and accuracy against step and wall time, samples/s, "
                "the stages' shares) and their summaries side by side");
  report->add_option("runs", report_.runs, "run folders (kdflow train --out)")->required();
  report->add_option("--out", report_.out,
                     "folder for the PNGs, report.md and report.json (default: RUN/report for one "
                     "run, ./report for several)");
  report->callback([this] { action_ = [this] { return report_command(report_); }; });
}

void Commands::add_train(CLI::App& app) {
  auto* train = app.add_subcommand("train", "train a student by distillation");
  train->add_option("--config", train_.config, "TOML configuration file")->check(CLI::ExistingFile);
  train->add_option("--set", train_.sets, "override one key: section.key=value (repeatable)");
  train->add_option("--out", train_.out, "run folder (config.toml, metrics.jsonl, checkpoints/)")
      ->capture_default_str();
  train->add_option("--resume", train_.resume, "continue from a checkpoint: auto or a path");
  train->add_option("--cores", train_.cores, "core plan JSON written by kdflow tune-cores");
  train->callback([this] { action_ = [this] { return train_command(train_); }; });
}

void Commands::add_eval(CLI::App& app) {
  auto* eval = app.add_subcommand(
      "eval", "a model's top-1 (and top-5) accuracy on the data's test split, and its images/s");
  eval->add_option("--model", eval_.model,
                   "ONNX model (kdflow's engine, read as a teacher) or TorchScript module (.pt)")
      ->required();
  eval->add_option("--config", eval_.config,
                   "TOML configuration file (the data, its normalization)")
      ->check(CLI::ExistingFile);
  eval->add_option("--set", eval_.sets, "override one key: section.key=value (repeatable)");
  eval->add_option("--json", eval_.json, "write the result as JSON here");
  eval->callback([this] { action_ = [this] { return eval_command(eval_); }; });
}

void Commands::add_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "the data as the loader makes it");
  data->require_subcommand(1);
  auto* sample = data->add_subcommand(
      "sample", "samples as the loader writes them at an epoch (crop, flip; before normalization): "
                "uint8 pixel values in a float32 .npy, the draws as JSON on stdout");
  sample->add_option("--config", data_.config, "TOML configuration file (the data, augmentation)")
      ->check(CLI::ExistingFile);
  sample->add_option("--set", data_.sets, "override one key: section.key=value (repeatable)");
  auto* index =
      sample->add_option("--index", data_.indices, "dataset index of a sample (repeatable)");
  sample
      ->add_option("--batch", data_.batch,
                   "instead of --index: batch B of the epoch as the loader writes it, mixed "
                   "(data.mixup_alpha, data.cutmix_alpha) as its slot holds it; the mix and each "
                   "sample's labels as JSON")
      ->check(CLI::NonNegativeNumber)
      ->excludes(index);
  sample->add_option("--epoch", data_.epoch, "the epoch whose draws to take")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sample->add_option("--split", data_.split, "train (augmented) or test (evaluation's crop)")
      ->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  sample->add_option("--out", data_.out, ".npy file of [samples, channels, height, width]")
      ->required();
  sample->callback([this] { action_ = [this] { return data_sample_command(data_); }; });
}

void Commands::add_export(CLI::App& app) {
  auto* exp = app.add_subcommand(
      "export", "a run's trained student as ONNX or TorchScript, checked against the student");
  exp->add_option("--run", export_.run, "run folder (config.toml, checkpoints/)")->required();
  exp->add_option("--step", export_.step, "the checkpoint of this step (default: the latest)")
      ->check(CLI::NonNegativeNumber);
  exp->add_option("--format", export_.format,
                  "onnx (built-in students), torchscript (TorchScript students), auto")
      ->check(CLI::IsMember({"auto", "onnx", "torchscript"}))
      ->capture_default_str();
  exp->add_option("--out", export_.out,
                  "file to write (not a file of a run folder; an existing one only with --force)")
      ->required();
  exp->add_flag("--force", export_.force, "replace --out if it exists");
  exp->callback([this] { action_ = [this] { return export_command(export_); }; });
}

void Commands::add_teacher(CLI::App& app) {
  // The batch in passes (teacher info and bench): how many samples per pass, how many at once.
  const auto add_pass_options = [this](CLI::App* command) {
    command
        ->add_option("--samples-per-pass", teacher_.samples_per_pass,
                     "run the batch in passes of this many samples (a divisor of the batch; 0: "
                     "with --tune auto the tuner times passes against the whole batch)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    command
        ->add_option("--passes-at-once", teacher_.passes_at_once,
                     "passes run at once, each on one thread: 1 (one at a time, on every "
                     "thread), the threads (a pass per thread), 0: with --tune auto the tuner "
                     "times both")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
  };
  auto* teacher =
      app.add_subcommand("teacher", "inspect, run and benchmark an ONNX teacher on oneDNN");
  teacher->require_subcommand(1);
  auto* info = teacher->add_subcommand(
      "info", "the graph after kdflow's passes: nodes, fused groups, parameters, FLOPs");
  info->add_option("--model", teacher_.model, "ONNX model")->required();
  info->add_option("--batch", teacher_.batch, "batch size to plan for")->capture_default_str();
  info->add_option("--input-size", teacher_.input_size,
                   "N or HxW: the height and width a model leaves open (or checks a fixed one)")
      ->capture_default_str();
  info->add_option("--calibration", teacher_.calibration,
                   "int8: .npy of real samples of the teacher's input (two batches or more)");
  info->add_option("--precision", teacher_.precision, "fp32, bf16 or int8")
      ->check(CLI::IsMember(teacher::precision_names()));
  info->add_option("--threads", teacher_.threads,
                   "threads the plan is tuned for (0: every allowed physical core)");
  info->add_option("--tune", teacher_.tune,
                   "time each node's ways at load and keep the fastest (default: auto with --plan, "
                   "else off, so that info stays quick on large models)")
      ->check(CLI::IsMember({"auto", "off"}));
  info->add_option("--feature", teacher_.features,
                   "plan with this intermediate value returned too, as teacher.features does "
                   "(repeatable)");
  add_pass_options(info);
  info->add_flag("--plan", teacher_.plan,
                 "list every node that can run more than one way: the ways, their times, the one "
                 "kept");
  info->callback([this] { action_ = [this] { return teacher_info(teacher_); }; });
  auto* infer = teacher->add_subcommand("infer", "run the teacher on a .npy batch");
  infer->add_option("--model", teacher_.model, "ONNX model")->required();
  infer->add_option("--input", teacher_.input, "input .npy (float32, C order, batch first)")
      ->required();
  infer->add_option("--output", teacher_.output, "output .npy (the logits; features beside it)")
      ->required();
  infer->add_option("--threads", teacher_.threads, "threads (0: every allowed physical core)");
  infer->add_option("--calibration", teacher_.calibration,
                    "int8: .npy of real samples of the teacher's input (two batches or more)");
  infer->add_option("--precision", teacher_.precision, "fp32, bf16 or int8")
      ->check(CLI::IsMember(teacher::precision_names()));
  infer->add_option("--feature", teacher_.features,
                    "also write this intermediate value (`teacher info` lists them) to "
                    "OUTPUT.<value>.npy, any character but letters, digits, '.' and '-' made "
                    "'_' (repeatable)");
  infer
      ->add_option("--tune", teacher_.tune,
                   "time each node's ways at load and keep the fastest (default: auto)")
      ->check(CLI::IsMember({"auto", "off"}));
  infer->callback([this] { action_ = [this] { return teacher_infer(teacher_); }; });
  auto* tbench = teacher->add_subcommand(
      "bench", "teacher throughput, and its share of the measured FMA peak");
  tbench->add_option("--model", teacher_.model, "ONNX model")->required();
  tbench->add_option("--batch", teacher_.batch, "batch size")->capture_default_str();
  tbench
      ->add_option("--input-size", teacher_.input_size,
                   "N or HxW: the height and width a model leaves open (or checks a fixed one)")
      ->capture_default_str();
  tbench->add_option("--threads", teacher_.threads, "threads (0: every allowed physical core)");
  tbench->add_option("--calibration", teacher_.calibration,
                     "int8: .npy of real samples of the teacher's input (two batches or more)");
  tbench->add_option("--precision", teacher_.precision, "fp32, bf16 or int8")
      ->check(CLI::IsMember(teacher::precision_names()));
  tbench->add_option("--seconds", teacher_.seconds, "measuring time")
      ->check(seconds(false))
      ->capture_default_str();
  tbench->add_option("--json", teacher_.json, "write the result as JSON here");
  tbench->add_option("--feature", teacher_.features,
                     "also return this intermediate value, as teacher.features does: its cost "
                     "measured (repeatable)");
  tbench
      ->add_option("--replicas", teacher_.replicas,
                   "run this many replicas of --threads each at once, each on its own physical "
                   "cores (a training run's teacher stage): their images/s together "
                   "(--threads 0: the cores shared out equally)")
      ->capture_default_str();
  add_pass_options(tbench);
  tbench->add_flag("--profile", teacher_.profile,
                   "also time every step of the plan and report where the time goes, by kind");
  tbench
      ->add_option("--tune", teacher_.tune,
                   "time each node's ways at load and keep the fastest (default: auto)")
      ->check(CLI::IsMember({"auto", "off"}));
  tbench->callback([this] { action_ = [this] { return teacher_bench(teacher_); }; });
}

void Commands::add_cores(CLI::App& app) {
  auto* cores = app.add_subcommand("cores", "show the topology and the core plan");
  cores->add_option("--synthetic", cores_.synthetic,
                    "plan for a synthetic hwloc topology, e.g. \"pack:2 numa:1 core:8 pu:2\"");
  cores->add_option("--gpu-numa", cores_.gpu_numa,
                    "with --synthetic: the NUMA node of each GPU, e.g. 0 or 0,0,0,0,1,1,1,1");
  cores
      ->add_option("--local-world-size", cores_.local_world,
                   "plan for this many ranks on the node (torchrun --nproc-per-node): each "
                   "rank's share of the cores and its plan inside it")
      ->check(CLI::Range(1, 4096));
  cores->add_flag("--json", cores_.json, "print JSON instead of a table");
  cores->add_option("--config", cores_.config, "TOML configuration file (cores.* and kd.alpha)")
      ->check(CLI::ExistingFile);
  cores->add_option("--set", cores_.sets, "override one key: section.key=value (repeatable)");
  cores->callback([this] { action_ = [this] { return cores_command(cores_); }; });
}

void Commands::add_tune(CLI::App& app) {
  auto* tune = app.add_subcommand(
      "tune-cores", "find the core plan (loaders, teacher replicas x threads, precision) that "
                    "maximizes distillation throughput here");
  tune->add_option("--config", tune_.config, "TOML configuration file")->check(CLI::ExistingFile);
  tune->add_option("--set", tune_.sets, "override one key: section.key=value (repeatable)");
  tune->add_option("--budget-s", tune_.budget_s, "time budget of the tuning in seconds")
      ->check(seconds(false))
      ->capture_default_str();
  tune->add_option("--verify", tune_.verify, "best predictions to verify with real runs")
      ->capture_default_str();
  tune->add_flag("--exhaustive", tune_.exhaustive,
                 "also run every valid plan and compare (quality check; takes longer)");
  tune->add_option("--out", tune_.out, "plan JSON to write (for train/bench-overlap --cores)")
      ->required();
  tune->callback([this] { action_ = [this] { return tune_cores_command(tune_); }; });
}

void Commands::add_overlap(CLI::App& app) {
  auto* overlap = app.add_subcommand(
      "bench-overlap", "the CPU-vs-GPU overlap benchmark: kdflow's pipeline against its parts "
                       "and the serial and colocated baselines");
  overlap->add_option("--config", overlap_.config, "TOML configuration file")
      ->check(CLI::ExistingFile);
  overlap->add_option("--set", overlap_.sets, "override one key: section.key=value (repeatable)");
  overlap->add_option("--cores", overlap_.cores, "core plan JSON written by kdflow tune-cores");
  overlap->add_option("--steps", overlap_.steps, "measured steps per repetition")
      ->capture_default_str();
  overlap->add_option("--warmup", overlap_.warmup,
                      "steps before measuring (at least the ring's slot count)");
  overlap->add_option("--repeats", overlap_.repeats, "repetitions per mode (the median is kept)")
      ->capture_default_str();
  overlap
      ->add_option("--min-seconds", overlap_.min_seconds,
                   "each measured window lasts at least this long (fast modes run more steps)")
      ->check(seconds(true))
      ->capture_default_str();
  overlap->add_option("--json", overlap_.json, "write every figure as JSON here");
  overlap->add_option("--trace", overlap_.trace,
                      "write a Chrome/Perfetto trace here (open in ui.perfetto.dev)");
  overlap->add_option("--plot", overlap_.plot, "write a bar chart of the modes here (PNG)");
  overlap->callback([this] { action_ = [this] { return bench_overlap_command(overlap_); }; });
}

int Commands::run() {
  if (version_) return print_versions();
  if (!action_) {
    fmt::print(stderr, "{}", app_.help());
    return kExitBadInput;
  }
  return action_();
}

} // namespace kdflow::app
