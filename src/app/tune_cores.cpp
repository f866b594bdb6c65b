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
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Rounds of the finalists' verification, and of the exhaustive comparison's confirmation.
constexpr std::size_t kVerifyRounds = 2, kConfirmRounds = 3;

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

// One tuning: the session, the candidate plans and the stage configurations to profile, then the
// phases in order (each stage alone, predictions, verifications, the report).
class CoreTuner {
public:
  explicit CoreTuner(const TuneArgs& args);
  // 1. Each stage alone: the student (its rate does not depend on the plan), the loader sets up
  // to the first that outruns the student, then the teacher configurations the plans left use.
  void profile();
  // 2. Predictions: each plan's slowest stage. 3. The best predictions measured as the real
  // pipeline (budget permitting: at least one); the winner.
  void predict_and_verify();
  [[nodiscard]] json report();
  // --exhaustive: every valid plan as a real pipeline run, the same window as a verification.
  void exhaustive(json& report);
  [[nodiscard]] const Candidate& winner() const { return *winner_; }

private:
  [[nodiscard]] double elapsed() const {
    return std::chrono::duration<double>(Clock::now() - started_).count();
  }
  [[nodiscard]] Setup setup_for(double seconds) {
    RunInputs& run = session_.run();
    return Setup{run,
                 session_.sampler(),
                 session_.slots(),
                 session_.slots(),
                 10,
                 seconds,
                 trainer_options(run, 1 << 20),
                 {},
                 {}};
  }
  // The run measured as candidate `c` plans it (its plan, its teacher precision).
  void use(const Candidate& c);
  void profile_loaders();
  void profile_teachers();
  // The teacher stage of `c` measured alone (rate kept per stage).
  double profile_teacher(const Candidate& c, const TeacherStage& stage);
  // Plans that leave CPUs spare: a teacher with more than kTeacherHeadroom times the rate its
  // plan needs keeps fewer of its replicas (the last, farthest from the student), halved while the
  // measured rate still has the headroom; the CPUs let go stay idle. Busy CPUs beside the
  // student slow it (their memory traffic, shared caches and power), so a plan that needs fewer
  // is tried first among equal predictions.
  void add_trimmed();
  [[nodiscard]] bool has_stage(const Candidate& c, const TeacherStage& stage) const {
    const auto stages = stages_of(c, nteachers_);
    return std::find(stages.begin(), stages.end(), stage) != stages.end();
  }

  const TuneArgs& args_;
  const Clock::time_point started_ = Clock::now();
  Session session_;
  std::size_t nteachers_ = 0;
  // The first teacher in each precision tried: bf16 only where the CPU runs it natively.
  std::map<teacher::Precision, std::shared_ptr<const teacher::Teacher>> teachers_;
  std::vector<Candidate> all_, every_; // every_: what --exhaustive measures
  // Distinct stage configurations to profile (loader sets ordered by size: each extends the last).
  std::map<affinity::CpuList, double> loader_rate_;
  std::map<TeacherStage, double> teacher_rate_; // each teacher's stage alone
  json dominated_ = json::array();
  double student_rate_ = 0, window_ = 0, tuning_s_ = 0;
  std::size_t verifies_ = 0;
  std::vector<Candidate>::const_iterator winner_;
};

CoreTuner::CoreTuner(const TuneArgs& args)
    : args_(args), session_([&]() -> Session {
        if (const auto dist = dist_env(); dist && dist->world > 1)
          throw InputError(fmt::format(
              "tune-cores under torchrun (WORLD_SIZE = {}): a plan file plans one process's "
              "node; several ranks each plan their share with cores.plan = auto (kdflow cores "
              "--local-world-size N shows them)",
              dist->world));
        return Session(args.config, args.sets);
      }()) {
  if (!(args.budget_s > 0)) throw InputError("--budget-s must be positive");
  if (args.verify < 1) throw InputError("--verify must be at least 1");
  if (!fs::is_directory(fs::absolute(args.out).parent_path()))
    throw InputError(fmt::format("--out {}: its folder does not exist", args.out));
  session_.prepare({});
  RunInputs& run = session_.run();
  nteachers_ = run.teachers.size();
  // Several teachers each keep their configured precision; their costs share out the cores when
  // the ways to share them are too many to try.
  std::vector<teacher::Precision> precisions = {teacher::Precision::fp32};
  if (run.teacher_runs() && teacher::has_native_bf16())
    precisions.push_back(teacher::Precision::bf16);
  // int8 changes the teacher more than bf16's rounding and needs a calibration: tried only where
  // the run asks for it (teacher.precision = int8), beside fp32 and bf16.
  if (run.teacher_runs() && run.teachers.front().spec.precision == teacher::Precision::int8)
    precisions.push_back(teacher::Precision::int8);
  if (nteachers_ > 1) precisions = {run.teachers.front().spec.precision};
  for (const auto p : precisions) {
    if (!run.teacher_runs()) break;
    // prepare_run already loaded the configured precision.
    const RunTeacher& first = run.teachers.front();
    teachers_[p] = p == first.spec.precision
                       ? first.model
                       : load_run_teacher(run, first.spec, p,
                                          static_cast<int>(run.plan.teacher.front().size()));
  }
  all_ = candidates(run, precisions, run.teacher_costs);
  if (all_.empty())
    throw InputError("tune-cores: no valid plan on this machine's allowed CPUs (one core: every "
                     "role shares it; use cores.plan = auto)");
  for (const auto& c : all_) {
    loader_rate_[c.plan.loader] = 0;
    if (c.precision)
      for (const TeacherStage& stage : stages_of(c, nteachers_)) teacher_rate_[stage] = 0;
  }
  every_ = all_;
  const std::size_t profiles = 1 + loader_rate_.size() + teacher_rate_.size();
  verifies_ = std::min<std::size_t>(static_cast<std::size_t>(args.verify), all_.size());
  // Window lengths from the budget: a profile half as long as a verification run, and the warm-up
  // (a lap of the ring) on top of each, guessed at a fifth of a window.
  window_ = std::clamp(args.budget_s / (1.2 * (0.5 * static_cast<double>(profiles) +
                                               static_cast<double>(kVerifyRounds * verifies_))),
                       0.3, 5.0);
  log_info(fmt::format("tune-cores: {} valid plan(s); profiling {} stage configuration(s), then "
                       "verifying {}; budget {:.0f} s",
                       all_.size(), profiles, verifies_, args.budget_s));
}

void CoreTuner::use(const Candidate& c) {
  RunInputs& run = session_.run();
  run.plan = c.plan;
  if (c.precision) {
    run.teachers.front().model = teachers_.at(*c.precision);
    run.teachers.front().spec.precision = *c.precision;
  }
}

void CoreTuner::profile() {
  use(all_.front());
  student_rate_ = run_rep(setup_for(0.5 * window_), Mode::student_alone).rate();
  log_info(fmt::format("[{:5.1f} s] student alone: {:.0f} samples/s", elapsed(), student_rate_));
  profile_loaders();
  profile_teachers();
  add_trimmed();
}

void CoreTuner::profile_loaders() {
  // More loader CPUs than it takes to outrun the student cannot raise a plan's rate (the slowest
  // stage's) but take CPUs from the teacher: once a loader set is faster than the student by
  // kLoaderHeadroom, the larger sets are dominated, and neither they nor the teacher
  // configurations only their plans use are profiled. --exhaustive measures them all the same.
  constexpr double kLoaderHeadroom = 1.25;
  for (auto it = loader_rate_.begin(); it != loader_rate_.end(); ++it) {
    Candidate c = all_.front();
    c.plan.loader = it->first;
    use(c);
    it->second = run_rep(setup_for(0.5 * window_), Mode::loader_alone).rate();
    log_info(fmt::format("[{:5.1f} s] loaders on {}: {:.0f} samples/s", elapsed(),
                         affinity::format_cpus(it->first), it->second));
    if (it->second >= kLoaderHeadroom * student_rate_) {
      for (auto rest = std::next(it); rest != loader_rate_.end(); ++rest)
        dominated_.push_back(rest->first);
      loader_rate_.erase(std::next(it), loader_rate_.end());
      break;
    }
  }
  std::erase_if(all_, [&](const Candidate& c) { return !loader_rate_.contains(c.plan.loader); });
  std::erase_if(teacher_rate_, [&](const auto& entry) {
    return std::none_of(all_.begin(), all_.end(),
                        [&](const Candidate& c) { return has_stage(c, entry.first); });
  });
  if (!dominated_.empty())
    log_info(fmt::format("tune-cores: {} larger loader set(s) dominated (the loaders on {} "
                         "already outrun the student); {} plan(s) and {} teacher profile(s) left",
                         dominated_.size(), affinity::format_cpus(loader_rate_.rbegin()->first),
                         all_.size(), teacher_rate_.size()));
}

double CoreTuner::profile_teacher(const Candidate& c, const TeacherStage& key) {
  double& rate = teacher_rate_[key];
  if (rate > 0) return rate;
  use(c);
  Setup setup = setup_for(0.5 * window_);
  if (nteachers_ > 1) setup.only_teacher = static_cast<std::size_t>(key.teacher);
  rate = run_rep(setup, Mode::teacher_alone).rate();
  log_info(fmt::format("[{:5.1f} s] teacher {}{} x{} {}: {:.0f} samples/s", elapsed(),
                       nteachers_ > 1 ? fmt::format("{}: ", key.teacher) : std::string(),
                       key.replicas.size(), key.replicas[0].size(),
                       teacher::precision_name(key.precision), rate));
  return rate;
}

void CoreTuner::profile_teachers() {
  for (const auto& entry : std::map(teacher_rate_))
    // A plan with this teacher stage, measured with that teacher alone.
    profile_teacher(*std::find_if(all_.begin(), all_.end(),
                                  [&](const Candidate& c) { return has_stage(c, entry.first); }),
                    entry.first);
}

void CoreTuner::add_trimmed() {
  // Several teachers share their CPUs by cost (teacher_shares); one alone may leave some idle.
  if (nteachers_ != 1 || !session_.run().teacher_runs()) return;
  constexpr double kTeacherHeadroom = 1.25;
  const RunInputs& run = session_.run();
  // The plan with its last `kept` replicas (none where that plan is not valid here).
  const auto trimmed = [&](const Candidate& c, std::size_t kept) -> std::optional<Candidate> {
    Candidate t = c;
    t.plan.teacher.erase(t.plan.teacher.begin(),
                         t.plan.teacher.begin() +
                             static_cast<std::ptrdiff_t>(c.plan.teacher.size() - kept));
    t.plan.teacher_of.assign(kept, 0);
    try {
      affinity::validate(t.plan, run.topology, true); // the CPUs let go become spare
    } catch (const InputError&) {
      return std::nullopt;
    }
    return t;
  };
  std::vector<Candidate> with;
  std::size_t added = 0;
  for (const Candidate& c : all_) {
    const double target =
        kTeacherHeadroom * std::min(student_rate_, loader_rate_.at(c.plan.loader));
    const std::size_t n = c.plan.teacher.size();
    std::size_t kept = n;
    if (c.precision && n > 1 && teacher_rate_.at(stages_of(c, 1)[0]) >= target)
      kept = fewest_replicas(n, target, [&](std::size_t r) {
        const auto t = trimmed(c, r);
        return t ? profile_teacher(*t, stages_of(*t, 1)[0]) : 0.0;
      });
    std::optional<Candidate> t;
    if (kept < n) t = trimmed(c, kept); // none where that plan is not valid (its rate was 0)
    if (t) {
      const auto label = t->label();
      const auto same = [&](const Candidate& o) { return o.label() == label; };
      if (std::none_of(with.begin(), with.end(), same)) {
        with.push_back(*t);
        if (std::none_of(every_.begin(), every_.end(), same)) every_.push_back(std::move(*t));
        ++added;
      }
    }
    with.push_back(c);
  }
  all_ = std::move(with);
  if (added > 0)
    log_info(fmt::format("tune-cores: {} plan(s) with fewer teacher replicas and CPUs left spare "
                         "(a teacher with {:.2f}x the headroom it needs)",
                         added, kTeacherHeadroom));
}

void CoreTuner::predict_and_verify() {
  // Ties keep the candidates' order (fewer loader cores, fewer replicas, fp32 first), so equal
  // measurements give the same choice.
  for (auto& c : all_) {
    c.predicted = std::min(student_rate_, loader_rate_.at(c.plan.loader));
    c.bottleneck = c.predicted == student_rate_ ? "student" : "loader";
    if (!session_.run().teacher_runs()) continue;
    // Each teacher works on every batch: the slowest of them, or, where they share CPUs, the
    // time they take one after the other.
    const auto stages = stages_of(c, nteachers_);
    double t = INFINITY, shared_s = 0;
    std::size_t slowest = 0;
    for (std::size_t k = 0; k < stages.size(); ++k) {
      const double r = teacher_rate_.at(stages[k]);
      shared_s += 1 / r;
      if (r < t) {
        t = r;
        slowest = k;
      }
    }
    const bool share = nteachers_ > 1 && stages[0].replicas == stages[1].replicas;
    if (share) t = 1 / shared_s;
    if (t < c.predicted) {
      c.predicted = t;
      c.bottleneck = nteachers_ == 1 ? std::string("teacher")
                     : share         ? std::string("teachers")
                                     : fmt::format("teacher {}", slowest);
    }
  }
  std::stable_sort(all_.begin(), all_.end(), [](const Candidate& a, const Candidate& b) {
    return a.predicted > b.predicted * 1.02;
  });
  // The finalists in interleaved rounds (each round measures every finalist once), so that a
  // drift of the machine (clocks, a neighbour) falls on all of them alike; a finalist's rate is
  // the mean of its rounds.
  std::vector<std::vector<double>> rounds(verifies_);
  for (std::size_t r = 0, done = 0; r < kVerifyRounds; ++r)
    for (std::size_t i = 0; i < verifies_; ++i, ++done) {
      if (done > 0 && elapsed() + window_ * 1.2 > args_.budget_s) {
        log_warn(fmt::format("tune-cores: budget reached; {} of {} verification runs", done,
                             kVerifyRounds * verifies_));
        r = kVerifyRounds;
        break;
      }
      use(all_[i]);
      rounds[i].push_back(run_rep(setup_for(window_), Mode::overlapped).rate());
      all_[i].measured = std::accumulate(rounds[i].begin(), rounds[i].end(), 0.0) /
                         static_cast<double>(rounds[i].size());
      log_info(fmt::format("[{:5.1f} s] {}: predicted {:.0f}, measured {:.0f} samples/s{}",
                           elapsed(), all_[i].label(), all_[i].predicted, rounds[i].back(),
                           rounds[i].size() > 1 ? fmt::format(" (mean of {}: {:.0f})",
                                                              rounds[i].size(), all_[i].measured)
                                                : std::string()));
    }
  // The winner: the best measured; within 2% of it, the better prediction (earlier) wins.
  double best_measured = 0;
  for (const auto& c : all_) best_measured = std::max(best_measured, c.measured);
  winner_ = std::find_if(all_.begin(), all_.end(), [&](const Candidate& c) {
    return c.measured > 0 && c.measured >= 0.98 * best_measured;
  });
  tuning_s_ = elapsed();
  fmt::print("\n{:<4} {:<52} {:>10} {:>10} {:>10}\n", "", "plan", "predicted", "measured",
             "bottleneck");
  for (const auto& c : all_)
    fmt::print("{:<4} {:<52} {:>10.0f} {:>10} {:>10}\n", &c == &*winner_ ? "->" : "", c.label(),
               c.predicted, c.measured > 0 ? fmt::format("{:.0f}", c.measured) : "-", c.bottleneck);
}

json CoreTuner::report() {
  const RunInputs& run = session_.run();
  json candidates_json = json::array();
  for (const auto& c : all_)
    candidates_json.push_back(
        {{"plan", affinity::to_json(c.plan)},
         {"teacher_precision", c.precision_text()},
         {"predicted_samples_per_s", c.predicted},
         {"measured_samples_per_s", c.measured > 0 ? json(c.measured) : json()},
         {"bottleneck", c.bottleneck}});
  json loaders = json::array(), teachers_json = json::array();
  for (const auto& [cpus, rate] : loader_rate_)
    loaders.push_back({{"cpus", cpus}, {"samples_per_s", rate}});
  for (const auto& [key, rate] : teacher_rate_)
    teachers_json.push_back({{"teacher", key.teacher},
                             {"replicas", key.replicas},
                             {"precision", teacher::precision_name(key.precision)},
                             {"samples_per_s", rate}});
  // The plan file's own keys (the one format --cores reads), then the tuner's report beside them.
  json report = affinity::plan_file_json(
      winner_->plan, winner_->precision ? teacher::precision_name(*winner_->precision) : "");
  report.update(
      json{{"predicted_samples_per_s", winner_->predicted},
           {"measured_samples_per_s", winner_->measured},
           {"bottleneck", winner_->bottleneck},
           {"profiles",
            {{"student_samples_per_s", student_rate_},
             {"loader", loaders},
             {"teacher", teachers_json},
             {"dominated_loader_sets", dominated_}}},
           {"valid_plans", every_.size()},
           {"candidates", candidates_json},
           {"tuning_s", tuning_s_},
           {"budget_s", args_.budget_s},
           {"window_s", window_},
           {"setup",
            {{"teacher", run.teacher_runs() ? run.teachers.front().spec.path : std::string()},
             {"student", session_.config().get_string("student.arch")},
             {"batch", run.sampler.batch_size},
             // Sized for each candidate's plan unless set (CpuPipeline::slots_for).
             {"ring_slots", session_.config().get_int("ring.slots") == 0
                                ? json("auto: sized for each plan")
                                : json(session_.config().get_int("ring.slots"))}}}});
  return report;
}

void CoreTuner::exhaustive(json& report) {
  const auto t0 = Clock::now();
  double best = 0, winner_there = 0;
  std::string best_label;
  json tried = json::array();
  for (const auto& c : every_) {
    use(c);
    const double rate = run_rep(setup_for(window_), Mode::overlapped).rate();
    log_info(fmt::format("exhaustive: {}: {:.0f} samples/s", c.label(), rate));
    tried.push_back({{"plan", c.label()}, {"measured_samples_per_s", rate}});
    if (rate > best) {
      best = rate;
      best_label = c.label();
    }
    if (c.label() == winner_->label()) winner_there = rate;
  }
  const double exhaustive_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // The sweep's best is the largest of many one-window measurements, which favours a lucky
  // window: the best and the tuned plan measured again side by side, in interleaved rounds, and
  // compared by their medians.
  std::vector<double> best_rounds, tuned_rounds;
  const auto best_plan = std::find_if(every_.begin(), every_.end(),
                                      [&](const Candidate& c) { return c.label() == best_label; });
  if (best_label != winner_->label())
    for (std::size_t r = 0; r < kConfirmRounds; ++r)
      for (const Candidate* c : std::initializer_list<const Candidate*>{&*best_plan, &*winner_}) {
        use(*c);
        (c == &*winner_ ? tuned_rounds : best_rounds)
            .push_back(run_rep(setup_for(window_), Mode::overlapped).rate());
      }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double confirmed = best_rounds.empty() ? 1.0 : median(tuned_rounds) / median(best_rounds);
  report["exhaustive"] = {
      {"plans", tried},
      {"best_plan", best_label},
      {"best_samples_per_s", best},
      {"tuned_plan_samples_per_s", winner_there},
      {"sweep_tuned_vs_best", winner_there / best},
      {"confirm_rounds",
       {{"best_samples_per_s", best_rounds}, {"tuned_samples_per_s", tuned_rounds}}},
      {"tuned_vs_best", confirmed},
      {"exhaustive_s", exhaustive_s},
      {"time_ratio", tuning_s_ / exhaustive_s}};
  fmt::print("\nexhaustive: best {} at {:.0f} samples/s; the tuned plan ran at {:.0f} ({:.3f} of "
             "the best in the sweep, {:.3f} in {} interleaved rounds of both); tuning took {:.1f} "
             "s, the exhaustive search {:.1f} s (ratio {:.2f})\n",
             best_label, best, winner_there, winner_there / best, confirmed,
             best_rounds.empty() ? 0 : kConfirmRounds, tuning_s_, exhaustive_s,
             tuning_s_ / exhaustive_s);
}

} // namespace

std::size_t fewest_replicas(std::size_t replicas, double target,
                            const std::function<double(std::size_t)>& rate_of) {
  std::size_t kept = replicas;
  while (kept > 1 && rate_of(kept / 2) >= target) kept /= 2;
  return kept;
}

int tune_cores_command(const TuneArgs& args) {
  CoreTuner tuner(args);
  tuner.profile();
  tuner.predict_and_verify();
  json report = tuner.report();
  if (args.exhaustive) tuner.exhaustive(report);
  write_file_atomic(args.out, report.dump(2) + "\n");
  fmt::print("\nplan: {} ({:.0f} samples/s measured, {} bound), written to {}\n",
             tuner.winner().label(), tuner.winner().measured, tuner.winner().bottleneck, args.out);
  return kExitOk;
}

} // namespace kdflow::app
