// Core plans: the automatic rule, plan files, validation and printing.
#include "kdflow/affinity/plan.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>

namespace kdflow::affinity {
namespace {

constexpr int kMaxReplicaThreads = 8; // beyond this a replica's oneDNN scaling flattens on CNNs
constexpr int kMaxCpu = 65535;        // CPU lists name OS CPU indices below this

// Splits `n` cores into `parts` near-equal runs.
std::vector<int> balanced_sizes(int n, int parts) {
  std::vector<int> sizes(static_cast<std::size_t>(parts), n / parts);
  for (int i = 0; i < n % parts; ++i) ++sizes[static_cast<std::size_t>(i)];
  return sizes;
}

CpuList sorted(CpuList v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The cores whose first PU is in `share` (all of them without one).
std::vector<Core> cores_in(const Topology& topology, const std::optional<CpuList>& share) {
  std::vector<Core> out;
  for (const auto& c : topology.cores())
    if (!share || std::find(share->begin(), share->end(), c.pus[0]) != share->end())
      out.push_back(c);
  return out;
}

} // namespace

std::vector<RankShare> rank_shares(const Topology& topology, int local_world,
                                   const std::vector<std::optional<CpuList>>& gpu_local) {
  const auto& cores = topology.cores();
  if (cores.empty()) throw InputError("cores: this process is allowed no CPU");
  if (local_world < 1) throw std::invalid_argument("rank_shares: local_world below 1");
  const auto ranks = static_cast<std::size_t>(local_world);
  std::vector<RankShare> shares(ranks);
  if (cores.size() < ranks) {
    for (std::size_t r = 0; r < ranks; ++r) {
      shares[r].cpus = cores[r % cores.size()].pus;
      shares[r].shared = true;
    }
    return shares;
  }
  const auto near = [](const Core& c, const std::optional<CpuList>& cpus) {
    return cpus && std::find(cpus->begin(), cpus->end(), c.pus[0]) != cpus->end();
  };
  const std::vector<int> sizes = balanced_sizes(static_cast<int>(cores.size()), local_world);
  std::vector<bool> taken(cores.size(), false);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::optional<CpuList> local = r < gpu_local.size() ? gpu_local[r] : std::nullopt;
    std::set<int> packages;
    for (const auto& c : cores)
      if (near(c, local)) packages.insert(c.package);
    // Three passes: near the GPU, same package, anywhere.
    const std::function<bool(const Core&)> passes[] = {
        [&](const Core& c) { return near(c, local); },
        [&](const Core& c) { return packages.count(c.package) > 0; },
        [](const Core&) { return true; }};
    int want = sizes[r];
    for (const auto& pass : passes)
      for (std::size_t i = 0; i < cores.size() && want > 0; ++i)
        if (!taken[i] && pass(cores[i])) {
          taken[i] = true;
          --want;
          shares[r].cpus.insert(shares[r].cpus.end(), cores[i].pus.begin(), cores[i].pus.end());
        }
    std::sort(shares[r].cpus.begin(), shares[r].cpus.end());
  }
  return shares;
}

std::vector<CpuList> teacher_replicas(const Topology& topology, const CpuList& cpus, int threads) {
  // Grouped by (NUMA node, L3) so a replica's threads share a cache and memory.
  std::map<std::pair<int, int>, CpuList> groups;
  for (const int cpu : cpus) {
    const auto core = std::find_if(topology.cores().begin(), topology.cores().end(),
                                   [&](const Core& c) { return c.pus[0] == cpu; });
    groups[core == topology.cores().end() ? std::pair(-1, -1) : std::pair(core->numa, core->l3)]
        .push_back(cpu);
  }
  std::vector<CpuList> out;
  for (const auto& [key, group] : groups) {
    const int n = static_cast<int>(group.size());
    std::vector<int> sizes;
    if (threads > 0) {
      const int t = std::min(threads, n);
      sizes.assign(static_cast<std::size_t>(n / t), t);
    } else {
      sizes = balanced_sizes(n, (n + kMaxReplicaThreads - 1) / kMaxReplicaThreads);
    }
    std::size_t next = 0;
    for (const int size : sizes) {
      out.emplace_back(group.begin() + static_cast<std::ptrdiff_t>(next),
                       group.begin() + static_cast<std::ptrdiff_t>(next + size));
      next += static_cast<std::size_t>(size);
    }
  }
  return out;
}

std::vector<std::size_t> teacher_core_counts(std::size_t cores, const std::vector<double>& costs) {
  const std::size_t t = std::max<std::size_t>(costs.size(), 1);
  if (cores < t) return std::vector<std::size_t>(t, cores);
  std::vector<std::size_t> count(t, 1);
  for (std::size_t left = cores - t; left > 0; --left) {
    std::size_t most = 0;
    for (std::size_t i = 1; i < t; ++i)
      if (costs[i] / static_cast<double>(count[i]) > costs[most] / static_cast<double>(count[most]))
        most = i;
    ++count[most];
  }
  return count;
}

Plan plan_auto(const Topology& topology, const PlanRequest& request) {
  const std::vector<Core> cores = cores_in(topology, request.share);
  if (cores.empty()) throw InputError("cores: this process is allowed no CPU");
  Plan plan;
  plan.source = "auto";

  // The student: the first core whose first PU is near the GPU, else the first core.
  const Core* student = &cores.front();
  if (request.gpu_local)
    for (const auto& c : cores)
      if (std::find(request.gpu_local->begin(), request.gpu_local->end(), c.pus[0]) !=
          request.gpu_local->end()) {
        student = &c;
        break;
      }
  plan.student = {student->pus[0]};

  // The other cores, those on the student's NUMA node first (loaders write into the ring's slab,
  // which lives there).
  std::vector<const Core*> rest;
  for (const auto& c : cores)
    if (&c != student) rest.push_back(&c);
  std::stable_sort(rest.begin(), rest.end(), [&](const Core* a, const Core* b) {
    return (a->numa != student->numa) < (b->numa != student->numa);
  });
  const int r = static_cast<int>(rest.size());

  std::vector<const Core*> teacher_cores;
  const std::size_t teachers = std::max<std::size_t>(request.teacher_costs.size(), 1);
  if (r == 0) { // one core: everything shares it
    plan.loader = plan.student;
    if (request.teacher_runs)
      for (std::size_t k = 0; k < teachers; ++k) {
        plan.teacher.push_back(plan.student);
        plan.teacher_of.push_back(static_cast<int>(k));
      }
  } else if (!request.teacher_runs) {
    for (const Core* c : rest) plan.loader.push_back(c->pus[0]);
  } else if (r == 1) { // two cores: the teacher gets a whole core, loaders share the student's
    plan.loader = plan.student;
    teacher_cores = rest;
  } else {
    int nl = request.loader_cores > 0 ? request.loader_cores : std::max(1, r / 4);
    if (nl >= r)
      throw InputError(fmt::format("cores: {} loader cores leave none of the {} remaining cores "
                                   "for the teacher",
                                   nl, r));
    for (int i = 0; i < nl; ++i) plan.loader.push_back(rest[static_cast<std::size_t>(i)]->pus[0]);
    teacher_cores.assign(rest.begin() + nl, rest.end());
  }

  if (!teacher_cores.empty()) {
    const std::vector<std::size_t> counts =
        teacher_core_counts(teacher_cores.size(), request.teacher_costs);
    const bool shared = teacher_cores.size() < teachers;
    std::size_t first = 0;
    for (std::size_t k = 0; k < teachers; ++k) {
      CpuList mine;
      for (std::size_t i = shared ? 0 : first; i < (shared ? 0 : first) + counts[k]; ++i)
        mine.push_back(teacher_cores[i]->pus[0]);
      for (CpuList& replica : teacher_replicas(topology, mine, request.teacher_threads)) {
        plan.teacher.push_back(std::move(replica));
        plan.teacher_of.push_back(static_cast<int>(k));
      }
      if (!shared) first += counts[k];
    }
  }
  validate(plan, topology, request.teacher_runs, request.share, teachers);
  return plan;
}

void validate(Plan& plan, const Topology& topology, bool teacher_runs,
              const std::optional<CpuList>& share, std::size_t teachers) {
  if (plan.teacher_of.empty()) plan.teacher_of.assign(plan.teacher.size(), 0);
  if (plan.teacher_of.size() != plan.teacher.size())
    throw InputError(fmt::format("core plan: 'teacher_of' names {} teachers for {} replicas",
                                 plan.teacher_of.size(), plan.teacher.size()));
  for (std::size_t i = 0; teacher_runs && i < plan.teacher_of.size(); ++i)
    if (plan.teacher_of[i] < 0 || static_cast<std::size_t>(plan.teacher_of[i]) >= teachers)
      throw InputError(fmt::format("core plan: replica teacher[{}] runs teacher {}, and the run "
                                   "has {} teacher(s) (numbered from 0)",
                                   i, plan.teacher_of[i], teachers));

  const CpuList allowed = share ? sorted(*share) : topology.allowed_cpus();
  const std::set<int> allowed_set(allowed.begin(), allowed.end());
  std::vector<std::pair<std::string, CpuList>> roles = {{"student", plan.student},
                                                        {"loader", plan.loader}};
  for (std::size_t i = 0; i < plan.teacher.size(); ++i)
    roles.emplace_back(fmt::format("teacher[{}]", i), plan.teacher[i]);

  for (const auto& [role, cpus] : roles) {
    CpuList bad;
    for (const int c : cpus)
      if (!allowed_set.count(c)) bad.push_back(c);
    if (!bad.empty())
      throw InputError(fmt::format("core plan: role '{}' uses CPUs {} not allowed to this {} "
                                   "(allowed: {})",
                                   role, format_cpus(sorted(bad)),
                                   share ? "rank's share of the node" : "process",
                                   format_cpus(allowed)));
    if (std::set<int>(cpus.begin(), cpus.end()).size() != cpus.size())
      throw InputError(fmt::format("core plan: role '{}' lists a CPU twice ({})", role,
                                   format_cpus(sorted(cpus))));
  }
  if (plan.student.empty()) throw InputError("core plan: role 'student' has no CPU");
  if (plan.loader.empty()) throw InputError("core plan: role 'loader' has no CPU");
  if (teacher_runs && plan.teacher.empty())
    throw InputError("core plan: role 'teacher' has no CPU");
  for (std::size_t i = 0; i < plan.teacher.size(); ++i)
    if (plan.teacher[i].empty())
      throw InputError(fmt::format("core plan: role 'teacher[{}]' has no CPU", i));
  if (teacher_runs)
    for (std::size_t k = 0; k < teachers; ++k)
      if (std::find(plan.teacher_of.begin(), plan.teacher_of.end(), static_cast<int>(k)) ==
          plan.teacher_of.end())
        throw InputError(fmt::format("core plan: teacher {} of {} has no replica", k, teachers));

  // Overlaps: loaders may share the student's CPUs on machines (or shares) of under 3 cores.
  const std::size_t cores = cores_in(topology, share).size();
  const bool small = cores < 3;
  const auto may_share = [&](const std::string& a, const std::string& b) {
    const auto pair_is = [&](const char* x, const char* y) {
      return (a == x && b == y) || (a == y && b == x);
    };
    return (small && pair_is("loader", "student")) || (cores < 2); // one core: everything shares it
  };
  // Replicas of different teachers may share CPUs: with fewer cores than teachers each teacher
  // still needs one. roles[2 + i] is teacher[i].
  const auto other_teachers = [&](std::size_t i, std::size_t j) {
    return i >= 2 && j >= 2 && plan.teacher_of[i - 2] != plan.teacher_of[j - 2];
  };
  for (std::size_t i = 0; i < roles.size(); ++i)
    for (std::size_t j = i + 1; j < roles.size(); ++j) {
      if (other_teachers(i, j)) continue;
      CpuList both;
      for (const int c : roles[i].second)
        if (std::find(roles[j].second.begin(), roles[j].second.end(), c) != roles[j].second.end())
          both.push_back(c);
      if (!both.empty() && !may_share(roles[i].first, roles[j].first))
        throw InputError(fmt::format("core plan: roles '{}' and '{}' overlap on CPUs {}",
                                     roles[i].first, roles[j].first, format_cpus(sorted(both))));
    }

  std::set<int> used;
  for (const auto& [role, cpus] : roles) used.insert(cpus.begin(), cpus.end());
  plan.spare.clear();
  for (const int c : allowed)
    if (!used.count(c)) plan.spare.push_back(c);
}

PlanFile read_plan_file(const std::filesystem::path& path) {
  check_input_file(path, "core plan file", std::uint64_t{64} << 20);
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot read the core plan file", path.string()));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(fmt::format("{}: not valid JSON (byte {})", path.string(), e.byte));
  } catch (const nlohmann::json::exception& e) { // a number too large for any type, ...
    throw InputError(fmt::format("{}: unreadable JSON ({})", path.string(), e.what()));
  }
  PlanFile file;
  // "-": the plan was tuned without a teacher (kd.alpha = 0).
  if (const auto p = doc.find("teacher_precision");
      doc.contains("plan") && p != doc.end() && *p != "-") {
    if (!p->is_string() || (*p != "fp32" && *p != "bf16" && *p != "int8"))
      throw InputError(
          fmt::format("{}: key 'teacher_precision' = {}: not \"fp32\", \"bf16\" or \"int8\"",
                      path.string(), p->dump()));
    file.teacher_precision = p->get<std::string>();
  }
  const nlohmann::json& j = doc.contains("plan") ? doc["plan"] : doc;
  if (!j.is_object())
    throw InputError(fmt::format("{}: key 'plan' must be an object", path.string()));
  const auto cpu_list = [&](const nlohmann::json& v, const std::string& key) {
    if (!v.is_array())
      throw InputError(
          fmt::format("{}: key '{}' must be a list of CPU numbers", path.string(), key));
    CpuList out;
    for (const auto& c : v) {
      if (!c.is_number_integer() || c.get<std::int64_t>() < 0 || c.get<std::int64_t>() > kMaxCpu)
        throw InputError(fmt::format("{}: key '{}' holds {}, not a CPU number (0 to {})",
                                     path.string(), key, c.dump(), kMaxCpu));
      out.push_back(static_cast<int>(c.get<std::int64_t>()));
    }
    return out;
  };
  Plan& plan = file.plan;
  plan.source = path.string();
  std::optional<CpuList> copy;
  for (const auto& [key, value] : j.items()) {
    if (key == "student")
      plan.student = cpu_list(value, key);
    else if (key == "copy")
      copy = cpu_list(value, key);
    else if (key == "loader")
      plan.loader = cpu_list(value, key);
    else if (key == "spare")
      (void)cpu_list(value, key); // recomputed by validate()
    else if (key == "source")
      continue; // informational, as to_json writes it
    else if (key == "teacher_of") {
      if (!value.is_array())
        throw InputError(
            fmt::format("{}: key 'teacher_of' must be a list of teacher numbers", path.string()));
      for (const auto& t : value) {
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > 1000)
          throw InputError(fmt::format("{}: key 'teacher_of' holds {}, not a teacher number",
                                       path.string(), t.dump()));
        plan.teacher_of.push_back(static_cast<int>(t.get<std::int64_t>()));
      }
    } else if (key == "teacher") {
      if (!value.is_array())
        throw InputError(
            fmt::format("{}: key 'teacher' must be a list of CPU lists", path.string()));
      for (std::size_t i = 0; i < value.size(); ++i)
        plan.teacher.push_back(cpu_list(value[i], fmt::format("teacher[{}]", i)));
    } else {
      throw InputError(fmt::format("{}: unknown key '{}' in the core plan", path.string(), key));
    }
  }
  // The device copies are issued from the student's thread: "copy" (as to_json writes it) may only
  // name the student's CPUs.
  if (copy && *copy != plan.student)
    throw InputError(
        fmt::format("{}: key 'copy' = {} differs from 'student' = {}: the device copies "
                    "are issued from the student's thread (leave 'copy' out)",
                    path.string(), format_cpus(*copy), format_cpus(plan.student)));
  return file;
}

nlohmann::json plan_file_json(const Plan& plan, const std::string& teacher_precision) {
  nlohmann::json doc = {{"plan", to_json(plan)}};
  if (!teacher_precision.empty()) doc["teacher_precision"] = teacher_precision;
  return doc;
}

CpuList parse_cpus(const std::string& text, const std::string& key) {
  CpuList out;
  std::size_t pos = 0;
  const auto bad = [&] {
    return InputError(fmt::format("{} = '{}': not a CPU list like \"0-3,8\"", key, text));
  };
  while (pos < text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string part = text.substr(pos, comma - pos);
    const std::size_t dash = part.find('-');
    try {
      std::size_t used = 0;
      const int lo = std::stoi(part.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? part.size() : dash) || lo < 0) throw bad();
      int hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(part.substr(dash + 1), &used);
        if (used != part.size() - dash - 1 || hi < lo) throw bad();
      }
      if (hi > kMaxCpu)
        throw InputError(fmt::format("{} = '{}': CPU {} is beyond any machine's (at most {})", key,
                                     text, hi, kMaxCpu));
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } catch (const std::logic_error&) {
      throw bad();
    }
    pos = comma + 1;
  }
  if (out.empty()) throw bad();
  return out;
}

Plan plan_from_config(const Config& config, const Topology& topology,
                      const std::optional<CpuList>& gpu_local, const std::optional<CpuList>& share,
                      std::vector<double> teacher_costs,
                      std::optional<std::size_t> teacher_count_given) {
  const bool teacher_runs =
      teacher_count_given ? *teacher_count_given > 0 : config.get_double("kd.alpha") > 0;
  const std::size_t teachers =
      !teacher_runs ? 1 : teacher_count_given.value_or(teacher_count(config));
  const std::string& student = config.get_string("cores.student_cpus");
  const std::string& loader = config.get_string("cores.loader_cpus");
  const std::string& teacher = config.get_string("cores.teacher_cpus");
  if (share && (!student.empty() || !loader.empty() || !teacher.empty()))
    throw InputError(fmt::format(
        "cores.{}_cpus: CPU lists plan one process's node; with several ranks on a node each "
        "plans its own share (cores.plan = auto)",
        !student.empty()  ? "student"
        : !loader.empty() ? "loader"
                          : "teacher"));
  if (share && config.get_string("cores.plan") != "auto")
    throw InputError(fmt::format("cores.plan = {}: a plan file plans one process's node; with "
                                 "several ranks on a node each plans its own share (cores.plan = "
                                 "auto)",
                                 config.get_string("cores.plan")));
  if (!student.empty() || !loader.empty() || !teacher.empty()) {
    Plan plan;
    plan.source = "config CPU lists";
    if (student.empty())
      throw InputError("cores.student_cpus: empty while other cores.*_cpus are set");
    if (loader.empty())
      throw InputError("cores.loader_cpus: empty while other cores.*_cpus are set");
    plan.student = parse_cpus(student, "cores.student_cpus");
    plan.loader = parse_cpus(loader, "cores.loader_cpus");
    // "a;b|c": teacher 0's replicas a and b, teacher 1's c.
    int which = 0;
    std::size_t pos = 0;
    while (!teacher.empty() && pos <= teacher.size()) {
      const std::size_t end = std::min(teacher.find_first_of(";|", pos), teacher.size());
      plan.teacher.push_back(parse_cpus(teacher.substr(pos, end - pos), "cores.teacher_cpus"));
      plan.teacher_of.push_back(which);
      if (end < teacher.size() && teacher[end] == '|') ++which;
      pos = end + 1;
    }
    validate(plan, topology, teacher_runs, std::nullopt, teachers);
    return plan;
  }
  const std::string& source = config.get_string("cores.plan");
  if (source != "auto") {
    Plan plan = read_plan_file(source).plan;
    validate(plan, topology, teacher_runs, std::nullopt, teachers);
    return plan;
  }
  PlanRequest request;
  request.loader_cores = static_cast<int>(config.get_int("cores.loader_cores"));
  request.teacher_threads = static_cast<int>(config.get_int("cores.teacher_threads"));
  request.teacher_runs = teacher_runs;
  request.teacher_costs =
      teacher_costs.empty() ? std::vector<double>(teachers, 1.0) : std::move(teacher_costs);
  request.gpu_local = gpu_local;
  request.share = share;
  return plan_auto(topology, request);
}

nlohmann::json to_json(const Plan& plan) {
  // "copy": where the device copies are issued from, the student's thread.
  nlohmann::json j = {{"student", plan.student}, {"copy", plan.student}, {"loader", plan.loader},
                      {"teacher", plan.teacher}, {"spare", plan.spare},  {"source", plan.source}};
  if (std::any_of(plan.teacher_of.begin(), plan.teacher_of.end(), [](int t) { return t != 0; }))
    j["teacher_of"] = plan.teacher_of;
  return j;
}

std::size_t teacher_count(const Config& config) {
  return 1 + config.get_tables("teacher.others").size();
}

nlohmann::json to_json(const Topology& topology) {
  nlohmann::json cores = nlohmann::json::array();
  for (const auto& c : topology.cores())
    cores.push_back({{"core", c.index},
                     {"pus", c.pus},
                     {"numa", c.numa},
                     {"l3", c.l3},
                     {"package", c.package}});
  return {{"description", topology.description()},
          {"packages", topology.packages()},
          {"numa_nodes", topology.numa_nodes()},
          {"cores", cores.size()},
          {"pus", topology.allowed_cpus().size()},
          {"allowed_cpus", topology.allowed_cpus()},
          {"core_list", cores}};
}

std::string format_plan(const Plan& plan, const Topology& topology) {
  std::string out = fmt::format("topology: {} | {} package(s), {} NUMA node(s), {} core(s), {} "
                                "PU(s), allowed CPUs {}\n",
                                topology.description(), topology.packages(), topology.numa_nodes(),
                                topology.cores().size(), topology.allowed_cpus().size(),
                                format_cpus(topology.allowed_cpus()));
  out += fmt::format("plan ({}):\n  {:<12} {:>7}  {}\n", plan.source, "role", "threads", "CPUs");
  const auto row = [&](const std::string& role, const CpuList& cpus) {
    out += fmt::format("  {:<12} {:>7}  {}\n", role, cpus.size(), format_cpus(sorted(cpus)));
  };
  row("student", plan.student);
  row("copy", plan.student);
  row("loader", plan.loader);
  const bool several =
      std::any_of(plan.teacher_of.begin(), plan.teacher_of.end(), [](int t) { return t != 0; });
  for (std::size_t i = 0; i < plan.teacher.size(); ++i)
    row(several && i < plan.teacher_of.size()
            ? fmt::format("teacher[{}] t{}", i, plan.teacher_of[i])
            : fmt::format("teacher[{}]", i),
        plan.teacher[i]);
  out += fmt::format("  {:<12} {:>7}  {}\n", "spare", "-",
                     plan.spare.empty() ? "none" : format_cpus(plan.spare));
  return out;
}

} // namespace kdflow::affinity
