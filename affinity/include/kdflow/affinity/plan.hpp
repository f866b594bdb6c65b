// A core plan: disjoint CPU sets for kdflow's roles. It comes from a rule that reads the topology
// (cores.plan = "auto", optionally with counts), or from a JSON file (kdflow tune-cores writes
// one); either way it is validated against the topology before anything is pinned.
#pragma once

#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/config.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kdflow::affinity {

struct Plan {
  CpuList student;              // one CPU near the GPU (it issues the device copies too); its SMT
                                // siblings stay idle
  CpuList loader;               // the loader pool
  std::vector<CpuList> teacher; // one CPU set per teacher replica (one thread per CPU)
  std::vector<int> teacher_of;  // the teacher each replica runs (several teachers: teacher.others);
                                // validate() fills it with 0s when left empty
  CpuList spare;                // unused: SMT siblings and what no role needs
  std::string source;           // how it was made: "auto", or the file it came from
};

struct PlanRequest {
  int loader_cores = 0;     // 0: auto (a quarter of the cores left after the student, at least 1)
  int teacher_threads = 0;  // threads per replica; 0: auto (replicas of at most 8 cores)
  bool teacher_runs = true; // false when kd.alpha = 0: no teacher cores are planned
  // One entry per teacher: its relative cost per sample (FLOPs), by which the teacher cores are
  // shared out so that the teachers, which work on every batch side by side, finish together.
  std::vector<double> teacher_costs = {1.0};
  std::optional<CpuList> gpu_local; // CPUs near the student's GPU, when there is one
  std::optional<CpuList> share;     // plan inside these CPUs only (a local rank's share)
};

// A local rank's share of its node, when torchrun starts several ranks there (LOCAL_WORLD_SIZE):
// each rank plans its roles inside its share as one process plans the node.
struct RankShare {
  CpuList cpus;        // every PU of the share's cores
  bool shared = false; // fewer cores than local ranks: another rank has this rank's core too
};
// The node's cores split among `local_world` ranks without overlap, in near-equal counts. Rank r
// takes, in rank order, the free cores nearest its GPU first (gpu_local[r], when known), then
// free cores of the packages those are in, then any; without locality, contiguous runs in
// topology order. With fewer cores than ranks, rank r gets core r mod cores (shared).
std::vector<RankShare> rank_shares(const Topology& topology, int local_world,
                                   const std::vector<std::optional<CpuList>>& gpu_local);

// A teacher's CPUs (each the first PU of a core) as its replicas: grouped by NUMA node and L3, each
// group split into replicas of `threads` CPUs (0: near-equal replicas of at most 8).
std::vector<CpuList> teacher_replicas(const Topology& topology, const CpuList& cpus, int threads);

// How many of `cores` teacher CPUs each teacher gets, `costs` being their costs per sample: one
// each, then each next CPU to the teacher whose cost per CPU is highest, so that the teachers,
// which all work on every batch, take about as long. With fewer CPUs than teachers, each gets all
// of them (they share).
std::vector<std::size_t> teacher_core_counts(std::size_t cores, const std::vector<double>& costs);

// The rule: the student on the first physical core near the GPU (copy beside it), loaders next on
// the student's NUMA node, teacher replicas on the remaining physical cores, each replica inside
// one NUMA node and L3; SMT siblings are spare. On 2 cores the loaders share the student's core;
// on 1 core every role shares it. Several teachers each get a share of the teacher cores in
// proportion to their costs (at least one core each); with fewer teacher cores than teachers,
// every teacher's one replica runs on all of them (the teachers share those cores).
Plan plan_auto(const Topology& topology, const PlanRequest& request);

// A plan file, the one format tune-cores writes and --cores / cores.plan read: {"plan": {"student":
// [..], "copy": [..], "loader": [..], "teacher": [[..], ..]}, "teacher_precision": "fp32" | "bf16"}
// beside the tuner's report (other keys); a bare plan object is accepted too.
struct PlanFile {
  Plan plan;
  std::string teacher_precision; // empty when the file does not say
};
// Errors name the file and key, InputError.
PlanFile read_plan_file(const std::filesystem::path& path);
// The plan file's own keys, for a writer to add its report to.
nlohmann::json plan_file_json(const Plan& plan, const std::string& teacher_precision);

// Throws InputError naming the role and CPUs when the plan is impossible here: a CPU not allowed to
// this process (or outside `share`, when given), roles that overlap (only copy, and with fewer
// than 3 cores the loaders, may share the student's CPUs; replicas of different teachers may share
// CPUs), no CPUs for a role that runs, or a teacher of the `teachers` without a replica. Fills
// `spare` (and `teacher_of`, when empty).
void validate(Plan& plan, const Topology& topology, bool teacher_runs,
              const std::optional<CpuList>& share = std::nullopt, std::size_t teachers = 1);

// Parses "0-3,8" (InputError naming `key` otherwise).
CpuList parse_cpus(const std::string& text, const std::string& key);

// The plan a run's configuration asks for: explicit CPU lists (cores.student_cpus, loader_cpus,
// teacher_cpus; with several teachers '|' between teachers' replicas), else cores.plan = "auto"
// (with cores.loader_cores and cores.teacher_threads) or a plan file; the teacher is planned only
// when kd.alpha > 0. With a `share` (a local rank's), only cores.plan = auto plans inside it: CPU
// lists and plan files describe one process's node and are refused (InputError naming the key).
// `teacher_costs`: one per teacher ([teacher], then teacher.others), empty for equal costs.
// `teachers`: how many teachers get cores (0: none), when the caller decided which run (a command
// that scores one model, or needs none); unset, the configuration's (none at kd.alpha = 0).
Plan plan_from_config(const Config& config, const Topology& topology,
                      const std::optional<CpuList>& gpu_local,
                      const std::optional<CpuList>& share = std::nullopt,
                      std::vector<double> teacher_costs = {},
                      std::optional<std::size_t> teachers = std::nullopt);

// The number of teachers a configuration names ([teacher] and its teacher.others).
std::size_t teacher_count(const Config& config);

nlohmann::json to_json(const Plan& plan);
nlohmann::json to_json(const Topology& topology);

// A human-readable table of the plan.
std::string format_plan(const Plan& plan, const Topology& topology);

} // namespace kdflow::affinity
