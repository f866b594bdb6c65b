// `kdflow tune-cores`: profiles each stage alone on the candidate plans, predicts each plan's rate
// (its slowest stage), verifies the best as the real pipeline and writes the winner as a plan file.
#include "tune_cores.hpp"

#include "modes.hpp"
#include "pipeline.hpp"
#include "run.hpp"
#include "session.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Candidate {
  affinity::Plan plan;
  std::optional<teacher::Precision> precision; // none when the teacher does not run
  double predicted = 0, measured = 0;          // samples/s (measured: 0 until verified)
  std::string bottleneck;
  [[nodiscard]] std::string precision_text() const {
    return precision ? teacher::precision_name(*precision) : "-";
  }
  [[nodiscard]] std::string label() const {
    std::string teacher;
    const bool several =
        std::any_of(plan.teacher_of.begin(), plan.teacher_of.end(), [](int t) { return t != 0; });
    for (std::size_t i = 0; i < plan.teacher.size(); ++i)
      teacher += (teacher.empty() ? "" : " ") +
                 (several ? fmt::format("t{}:", plan.teacher_of[i]) : std::string()) +
                 affinity::format_cpus(plan.teacher[i]);
    return fmt::format("loader {} | teacher {} x{} {}", affinity::format_cpus(plan.loader),
                       plan.teacher.size(), plan.teacher.empty() ? 0 : plan.teacher[0].size(),
                       precision_text()) +
           (teacher.empty() ? "" : " [" + teacher + "]");
  }
};

// A teacher's replicas and precision: what its stage's rate alone depends on (one of several
// teachers runs on its own replicas, on every batch).
struct TeacherStage {
  int teacher = 0;
  std::vector<affinity::CpuList> replicas;
  teacher::Precision precision{};
  auto operator<=>(const TeacherStage&) const = default;
};

// The teacher stages of a candidate, one per teacher.
std::vector<TeacherStage> stages_of(const Candidate& c, std::size_t teachers) {
  std::vector<TeacherStage> out(teachers);
  for (std::size_t k = 0; k < teachers; ++k) {
    out[k].teacher = static_cast<int>(k);
    out[k].precision = c.precision.value_or(teacher::Precision::fp32);
  }
  for (std::size_t i = 0; i < c.plan.teacher.size(); ++i)
    out[static_cast<std::size_t>(c.plan.teacher_of[i])].replicas.push_back(c.plan.teacher[i]);
  return out;
}

// Several teachers: every way to share `cpus` among them, each at least one (in order; a teacher's
// share as its replicas, affinity::teacher_replicas), or all of them for each when there are
// fewer CPUs than teachers (they then share). Beyond kMaxShares ways, only the one by cost per
// sample.
constexpr std::size_t kMaxShares = 64;
std::vector<std::pair<std::vector<affinity::CpuList>, std::vector<int>>>
teacher_shares(const affinity::Topology& topology, const affinity::CpuList& cpus,
               const std::vector<double>& costs) {
  const std::size_t t = costs.size();
  std::vector<std::pair<std::vector<affinity::CpuList>, std::vector<int>>> out;
  const auto add = [&](const std::vector<std::size_t>& counts) {
    std::pair<std::vector<affinity::CpuList>, std::vector<int>> plan;
    std::size_t first = 0;
    for (std::size_t k = 0; k < t; ++k) {
      const bool shared = cpus.size() < t;
      const auto from = cpus.begin() + static_cast<std::ptrdiff_t>(shared ? 0 : first);
      for (auto& replica : affinity::teacher_replicas(
               topology, affinity::CpuList(from, from + static_cast<std::ptrdiff_t>(counts[k])),
               0)) {
        plan.first.push_back(std::move(replica));
        plan.second.push_back(static_cast<int>(k));
      }
      if (!shared) first += counts[k];
    }
    out.push_back(std::move(plan));
  };
  if (cpus.size() < t) {
    add(std::vector<std::size_t>(t, cpus.size()));
    return out;
  }
  // Compositions of cpus.size() into t parts of at least 1: C(n - 1, t - 1) of them.
  double ways = 1;
  for (std::size_t i = 1; i < t; ++i)
    ways = ways * static_cast<double>(cpus.size() - i) / static_cast<double>(i);
  if (ways > static_cast<double>(kMaxShares)) {
    add(affinity::teacher_core_counts(cpus.size(), costs));
    return out;
  }
  std::vector<std::size_t> counts(t, 1);
  const std::function<void(std::size_t, std::size_t)> compose = [&](std::size_t k,
                                                                    std::size_t left) {
    if (k + 1 == t) {
      counts[k] = left;
      add(counts);
      return;
    }
    for (std::size_t c = 1; c + (t - k - 1) <= left; ++c) {
      counts[k] = c;
      compose(k + 1, left - c);
    }
  };
  compose(0, cpus.size());
  return out;
}

// Every valid plan around the run's student CPU: loader cores, then the teacher's cores split
// into equal replicas (each a divisor of the count), in each precision this CPU runs natively.
// Several teachers: the teacher cores shared among them every way (teacher_shares), each in its
// configured precision.
std::vector<Candidate> candidates(const RunInputs& run,
                                  const std::vector<teacher::Precision>& precisions,
                                  const std::vector<double>& costs) {
  const affinity::Plan& base = run.plan;
  std::vector<int> rest; // first PU of each allowed core the student does not use
  for (const auto& core : run.topology.cores())
    if (std::none_of(core.pus.begin(), core.pus.end(), [&](int pu) {
          return std::find(base.student.begin(), base.student.end(), pu) != base.student.end();
        }))
      rest.push_back(core.pus[0]);
  std::vector<std::pair<affinity::CpuList, affinity::CpuList>> splits; // loader, teacher CPUs
  const std::size_t n = rest.size();
  if (!run.teacher_runs()) {
    for (std::size_t l = 1; l <= n; ++l) splits.push_back({{rest.begin(), rest.begin() + l}, {}});
    if (n == 0) splits.push_back({base.student, {}});
  } else if (n < 2) {
    // Fewer than 3 cores: the loaders share the student's core (validate() allows only that).
    if (n == 1) splits.push_back({base.student, rest});
  } else {
    for (std::size_t l = 1; l < n; ++l)
      splits.push_back({{rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(l)},
                        {rest.begin() + static_cast<std::ptrdiff_t>(l), rest.end()}});
  }
  std::vector<std::optional<teacher::Precision>> choices(precisions.begin(), precisions.end());
  if (!run.teacher_runs()) choices = {std::nullopt};
  std::vector<Candidate> out;
  const auto keep = [&](Candidate c) {
    c.plan.source = "kdflow tune-cores";
    try {
      affinity::validate(c.plan, run.topology, run.teacher_runs(), std::nullopt,
                         std::max<std::size_t>(run.teachers.size(), 1));
    } catch (const InputError&) {
      return; // e.g. a replica across NUMA nodes
    }
    out.push_back(std::move(c));
  };
  if (run.teachers.size() > 1) {
    for (const auto& [loader, teacher] : splits)
      for (auto& [replicas, of] : teacher_shares(run.topology, teacher, costs)) {
        Candidate c;
        c.plan = base;
        c.plan.loader = loader;
        c.plan.teacher = replicas;
        c.plan.teacher_of = of;
        c.precision = run.teachers.front().spec.precision;
        keep(std::move(c));
      }
    return out;
  }
  for (const auto& [loader, teacher] : splits) {
    std::vector<std::size_t> widths = {0};
    if (!teacher.empty()) {
      widths.clear();
      for (std::size_t t = 1; t <= teacher.size(); ++t)
        if (teacher.size() % t == 0) widths.push_back(t);
    }
    for (const std::size_t t : widths)
      for (const auto precision : choices) {
        Candidate c;
        c.plan = base;
        c.plan.loader = loader;
        c.plan.teacher.clear();
        c.plan.teacher_of.clear();
        for (std::size_t i = 0; t > 0 && i < teacher.size(); i += t)
          c.plan.teacher.push_back({teacher.begin() + static_cast<std::ptrdiff_t>(i),
                                    teacher.begin() + static_cast<std::ptrdiff_t>(i + t)});
        c.precision = precision;
        keep(std::move(c));
      }
  }
  return out;
}

} // namespace

int tune_cores_command(const TuneArgs& args) {
  const auto started = Clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - started).count();
  };
  if (const auto dist = dist_env(); dist && dist->world > 1)
    throw InputError(fmt::format("tune-cores under torchrun (WORLD_SIZE = {}): a plan file plans "
                                 "one process's node; several ranks each plan their share with "
                                 "cores.plan = auto (kdflow cores --local-world-size N shows them)",
                                 dist->world));
  Session session(args.config, args.sets);
  const Config& config = session.config();
  if (!(args.budget_s > 0)) throw InputError("--budget-s must be positive");
  if (args.verify < 1) throw InputError("--verify must be at least 1");
  if (!fs::is_directory(fs::absolute(args.out).parent_path()))
    throw InputError(fmt::format("--out {}: its folder does not exist", args.out));

  session.prepare({});
  RunInputs& run = session.run();
  const Sampler& sampler = session.sampler();
  const std::uint32_t slots = session.slots();

  // The teacher in each precision to try: bf16 only where the CPU runs it natively. Several
  // teachers each keep their configured precision; their costs share out the cores when the ways
  // to share them are too many to try.
  std::vector<teacher::Precision> precisions = {teacher::Precision::fp32};
  if (run.teacher_runs() && teacher::has_native_bf16())
    precisions.push_back(teacher::Precision::bf16);
  if (run.teachers.size() > 1) precisions = {run.teachers.front().spec.precision};
  std::map<teacher::Precision, std::shared_ptr<const teacher::Teacher>> teachers;
  for (const auto p : precisions) {
    if (!run.teacher_runs()) break;
    // prepare_run already loaded the configured precision.
    const RunTeacher& first = run.teachers.front();
    teachers[p] = p == first.spec.precision
                      ? first.model
                      : load_run_teacher(run, first.spec, p,
                                         static_cast<int>(run.plan.teacher.front().size()));
  }
  std::vector<Candidate> all = candidates(run, precisions, run.teacher_costs);
  if (all.empty())
    throw InputError("tune-cores: no valid plan on this machine's allowed CPUs (one core: every "
                     "role shares it; use cores.plan = auto)");

  // Distinct stage configurations to profile (at most: loader sets beyond the first that outruns
  // the student are skipped, and so are the teacher configurations only their plans use).
  std::map<affinity::CpuList, double> loader_rate; // ordered by size: each set extends the last
  std::map<TeacherStage, double> teacher_rate;     // each teacher's stage alone
  const std::size_t nteachers = run.teachers.size();
  for (const auto& c : all) {
    loader_rate[c.plan.loader] = 0;
    if (c.precision)
      for (const TeacherStage& stage : stages_of(c, nteachers)) teacher_rate[stage] = 0;
  }
  const std::vector<Candidate> every = all; // what --exhaustive measures
  const std::size_t profiles = 1 + loader_rate.size() + teacher_rate.size();
  const std::size_t verifies =
      std::min<std::size_t>(static_cast<std::size_t>(args.verify), all.size());
  // Window lengths from the budget: a profile half as long as a verification run, and the warm-up
  // (a lap of the ring) on top of each, guessed at a fifth of a window.
  const double window = std::clamp(
      args.budget_s / (1.2 * (0.5 * static_cast<double>(profiles) + static_cast<double>(verifies))),
      0.3, 5.0);
  const auto setup_for = [&](double seconds) {
    return Setup{run, sampler, slots, slots, 10, seconds, trainer_options(run, 1 << 20), {}, {}};
  };
  const auto use = [&](const Candidate& c) {
    run.plan = c.plan;
    if (c.precision) {
      run.teachers.front().model = teachers.at(*c.precision);
      run.teachers.front().spec.precision = *c.precision;
    }
  };
  log_info(fmt::format("tune-cores: {} valid plan(s); profiling {} stage configuration(s), then "
                       "verifying {}; budget {:.0f} s",
                       all.size(), profiles, verifies, args.budget_s));

  // 1. Each stage alone. The student's rate does not depend on the plan (its CPUs are fixed).
  use(all.front());
  const double student_rate = run_rep(setup_for(0.5 * window), Mode::student_alone).rate();
  log_info(fmt::format("[{:5.1f} s] student alone: {:.0f} samples/s", elapsed(), student_rate));
  // More loader CPUs than it takes to outrun the student cannot raise a plan's rate (the slowest
  // stage's) but take CPUs from the teacher: once a loader set is faster than the student by
  // kLoaderHeadroom, the larger sets are dominated, and neither they nor the teacher
  // configurations only their plans use are profiled. --exhaustive measures them all the same.
  constexpr double kLoaderHeadroom = 1.25;
  json dominated = json::array();
  for (auto it = loader_rate.begin(); it != loader_rate.end(); ++it) {
    Candidate c = all.front();
    c.plan.loader = it->first;
    use(c);
    it->second = run_rep(setup_for(0.5 * window), Mode::loader_alone).rate();
    log_info(fmt::format("[{:5.1f} s] loaders on {}: {:.0f} samples/s", elapsed(),
                         affinity::format_cpus(it->first), it->second));
    if (it->second >= kLoaderHeadroom * student_rate) {
      for (auto rest = std::next(it); rest != loader_rate.end(); ++rest)
        dominated.push_back(rest->first);
      loader_rate.erase(std::next(it), loader_rate.end());
      break;
    }
  }
  std::erase_if(all, [&](const Candidate& c) { return !loader_rate.contains(c.plan.loader); });
  std::erase_if(teacher_rate, [&](const auto& entry) {
    return std::none_of(all.begin(), all.end(), [&](const Candidate& c) {
      const auto stages = stages_of(c, nteachers);
      return std::find(stages.begin(), stages.end(), entry.first) != stages.end();
    });
  });
  if (!dominated.empty())
    log_info(fmt::format("tune-cores: {} larger loader set(s) dominated (the loaders on {} "
                         "already outrun the student); {} plan(s) and {} teacher profile(s) left",
                         dominated.size(), affinity::format_cpus(loader_rate.rbegin()->first),
                         all.size(), teacher_rate.size()));
  for (auto& [key, rate] : teacher_rate) {
    // A plan with this teacher stage, measured with that teacher alone.
    const auto with = std::find_if(all.begin(), all.end(), [&](const Candidate& c) {
      const auto stages = stages_of(c, nteachers);
      return std::find(stages.begin(), stages.end(), key) != stages.end();
    });
    use(*with);
    Setup setup = setup_for(0.5 * window);
    if (nteachers > 1) setup.only_teacher = static_cast<std::size_t>(key.teacher);
    rate = run_rep(setup, Mode::teacher_alone).rate();
    log_info(fmt::format("[{:5.1f} s] teacher {}{} x{} {}: {:.0f} samples/s", elapsed(),
                         nteachers > 1 ? fmt::format("{}: ", key.teacher) : std::string(),
                         key.replicas.size(), key.replicas[0].size(),
                         teacher::precision_name(key.precision), rate));
  }
  // 2. Predictions: the slowest stage's rate. Ties keep the order below (fewer loader cores,
  // fewer replicas, fp32 first), so equal measurements give the same choice.
  for (auto& c : all) {
    c.predicted = std::min(student_rate, loader_rate.at(c.plan.loader));
    c.bottleneck = c.predicted == student_rate ? "student" : "loader";
    if (run.teacher_runs()) {
      // Each teacher works on every batch: the slowest of them, or, where they share CPUs, the
      // time they take one after the other.
      const auto stages = stages_of(c, nteachers);
      double t = INFINITY, shared_s = 0;
      std::size_t slowest = 0;
      for (std::size_t k = 0; k < stages.size(); ++k) {
        const double r = teacher_rate.at(stages[k]);
        shared_s += 1 / r;
        if (r < t) {
          t = r;
          slowest = k;
        }
      }
      const bool share = nteachers > 1 && stages[0].replicas == stages[1].replicas;
      if (share) t = 1 / shared_s;
      if (t < c.predicted) {
        c.predicted = t;
        c.bottleneck = nteachers == 1 ? std::string("teacher")
                       : share        ? std::string("teachers")
                                      : fmt::format("teacher {}", slowest);
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.predicted > b.predicted * 1.02;
  });
  // 3. The best predictions, measured as the real pipeline (budget permitting: at least one).
  for (std::size_t i = 0; i < verifies; ++i) {
    if (i > 0 && elapsed() + window * 1.2 > args.budget_s) {
      log_warn(fmt::format("tune-cores: budget reached; {} of {} verifications run", i, verifies));
      break;
    }
    use(all[i]);
    all[i].measured = run_rep(setup_for(window), Mode::overlapped).rate();
    log_info(fmt::format("[{:5.1f} s] {}: predicted {:.0f}, measured {:.0f} samples/s", elapsed(),
                         all[i].label(), all[i].predicted, all[i].measured));
  }
  // The winner: the best measured; within 2% of it, the better prediction (earlier) wins.
  double best_measured = 0;
  for (const auto& c : all) best_measured = std::max(best_measured, c.measured);
  const auto winner = std::find_if(all.begin(), all.end(), [&](const Candidate& c) {
    return c.measured > 0 && c.measured >= 0.98 * best_measured;
  });
  const double tuning_s = elapsed();

  fmt::print("\n{:<4} {:<52} {:>10} {:>10} {:>10}\n", "", "plan", "predicted", "measured",
             "bottleneck");
  for (const auto& c : all)
    fmt::print("{:<4} {:<52} {:>10.0f} {:>10} {:>10}\n", &c == &*winner ? "->" : "", c.label(),
               c.predicted, c.measured > 0 ? fmt::format("{:.0f}", c.measured) : "-", c.bottleneck);

  json candidates_json = json::array();
  for (const auto& c : all)
    candidates_json.push_back(
        {{"plan", affinity::to_json(c.plan)},
         {"teacher_precision", c.precision_text()},
         {"predicted_samples_per_s", c.predicted},
         {"measured_samples_per_s", c.measured > 0 ? json(c.measured) : json()},
         {"bottleneck", c.bottleneck}});
  json loaders = json::array(), teachers_json = json::array();
  for (const auto& [cpus, rate] : loader_rate)
    loaders.push_back({{"cpus", cpus}, {"samples_per_s", rate}});
  for (const auto& [key, rate] : teacher_rate)
    teachers_json.push_back({{"teacher", key.teacher},
                             {"replicas", key.replicas},
                             {"precision", teacher::precision_name(key.precision)},
                             {"samples_per_s", rate}});
  // The plan file's own keys (the one format --cores reads), then the tuner's report beside them.
  json report = affinity::plan_file_json(
      winner->plan, winner->precision ? teacher::precision_name(*winner->precision) : "");
  report.update(
      json{{"predicted_samples_per_s", winner->predicted},
           {"measured_samples_per_s", winner->measured},
           {"bottleneck", winner->bottleneck},
           {"profiles",
            {{"student_samples_per_s", student_rate},
             {"loader", loaders},
             {"teacher", teachers_json},
             {"dominated_loader_sets", dominated}}},
           {"valid_plans", every.size()},
           {"candidates", candidates_json},
           {"tuning_s", tuning_s},
           {"budget_s", args.budget_s},
           {"window_s", window},
           {"setup",
            {{"teacher", run.teacher_runs() ? run.teachers.front().spec.path : std::string()},
             {"student", config.get_string("student.arch")},
             {"batch", run.sampler.batch_size},
             {"ring_slots", slots}}}});

  if (args.exhaustive) {
    // Every valid plan as a real pipeline run, the same window as a verification.
    const auto t0 = Clock::now();
    double best = 0;
    std::string best_label;
    json tried = json::array();
    double winner_there = 0;
    for (const auto& c : every) {
      use(c);
      const double rate = run_rep(setup_for(window), Mode::overlapped).rate();
      log_info(fmt::format("exhaustive: {}: {:.0f} samples/s", c.label(), rate));
      tried.push_back({{"plan", c.label()}, {"measured_samples_per_s", rate}});
      if (rate > best) {
        best = rate;
        best_label = c.label();
      }
      if (c.label() == winner->label()) winner_there = rate;
    }
    const double exhaustive_s = std::chrono::duration<double>(Clock::now() - t0).count();
    report["exhaustive"] = {{"plans", tried},
                            {"best_plan", best_label},
                            {"best_samples_per_s", best},
                            {"tuned_plan_samples_per_s", winner_there},
                            {"tuned_vs_best", winner_there / best},
                            {"exhaustive_s", exhaustive_s},
                            {"time_ratio", tuning_s / exhaustive_s}};
    fmt::print("\nexhaustive: best {} at {:.0f} samples/s; the tuned plan ran at {:.0f} ({:.3f} of "
               "the best); tuning took {:.1f} s, the exhaustive search {:.1f} s (ratio {:.2f})\n",
               best_label, best, winner_there, winner_there / best, tuning_s, exhaustive_s,
               tuning_s / exhaustive_s);
  }
  write_file_atomic(args.out, report.dump(2) + "\n");
  fmt::print("\nplan: {} ({:.0f} samples/s measured, {} bound), written to {}\n", winner->label(),
             winner->measured, winner->bottleneck, args.out);
  return kExitOk;
}

} // namespace kdflow::app
