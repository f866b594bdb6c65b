// `kdflow cores` (cores_command.hpp): the machine's topology (or a synthetic one) and the plan the
// configuration gives it, for one process or each local rank.
#include "cores_command.hpp"

#include "run.hpp"

#include "kdflow/affinity/plan.hpp"
#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/error.hpp"

#include <charconv>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {

int cores_command(const CoresArgs& args) {
  const auto print = [&](const std::string& text) {
    if (args.print)
      args.print(text);
    else
      fmt::print("{}", text);
  };
  const Config config = resolve_config(args.config, args.sets);
  const bool synthetic = !args.synthetic.empty();
  const affinity::Topology topology =
      synthetic ? affinity::Topology::synthetic(args.synthetic) : affinity::Topology::load();
  // GPU k is local rank k's.
  std::vector<affinity::GpuLocality> gpus;
  if (synthetic && !args.gpu_numa.empty()) {
    std::stringstream in(args.gpu_numa);
    for (std::string item; std::getline(in, item, ',');) {
      int node = -1;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), node);
      if (ec != std::errc() || end != item.data() + item.size() || node < 0 ||
          node >= topology.numa_nodes())
        throw InputError(fmt::format("--gpu-numa {}: '{}' is not a NUMA node of the topology (it "
                                     "has {})",
                                     args.gpu_numa, item, topology.numa_nodes()));
      gpus.push_back({fmt::format("described GPU {} (NUMA node {})", gpus.size(), node),
                      topology.numa_cpus(node)});
    }
  } else if (!synthetic) {
    gpus = gpu_localities(topology);
  }
  nlohmann::json gpu_json = nlohmann::json::array();
  for (const auto& g : gpus) gpu_json.push_back({{"name", g.name}, {"local_cpus", g.local_cpus}});
  const auto local_world = static_cast<std::size_t>(args.local_world);
  std::vector<std::optional<affinity::CpuList>> near(local_world);
  for (std::size_t r = 0; r < local_world && r < gpus.size(); ++r) near[r] = gpus[r].local_cpus;

  // Several teachers share the teacher cores by their costs, which their inputs decide.
  std::vector<double> costs;
  if (config.get_double("kd.alpha") > 0 && affinity::teacher_count(config) > 1) {
    const Dataset train = Dataset::load(config.get_string("data.dataset"),
                                        config.get_string("data.path"), Split::train,
                                        {static_cast<int>(config.get_int("data.image_size")),
                                         static_cast<int>(config.get_int("data.resize"))});
    costs = teacher_costs(config, teacher_specs(config),
                          {train.channels(), train.height(), train.width()});
  }
  if (local_world == 1) {
    const affinity::Plan plan =
        affinity::plan_from_config(config, topology, near[0], std::nullopt, costs);
    if (args.json) {
      nlohmann::json topo = affinity::to_json(topology);
      topo["gpus"] = gpu_json;
      print(nlohmann::json{{"topology", topo}, {"plan", affinity::to_json(plan)}}.dump(2) + "\n");
      return kExitOk;
    }
    print(affinity::format_plan(plan, topology));
  } else {
    const auto shares = affinity::rank_shares(topology, args.local_world, near);
    nlohmann::json ranks = nlohmann::json::array();
    for (std::size_t r = 0; r < local_world; ++r) {
      const affinity::Plan plan =
          affinity::plan_from_config(config, topology, near[r], shares[r].cpus, costs);
      ranks.push_back({{"local_rank", r},
                       {"gpu", r < gpus.size() ? nlohmann::json(gpus[r].name) : nlohmann::json()},
                       {"share", shares[r].cpus},
                       {"shared", shares[r].shared},
                       {"plan", affinity::to_json(plan)}});
      if (!args.json)
        print(fmt::format("local rank {}{}: share {}{}\n{}", r,
                          r < gpus.size() ? " (" + gpus[r].name + ")" : std::string(),
                          affinity::format_cpus(shares[r].cpus),
                          shares[r].shared ? " (shared with other ranks: fewer cores than ranks)"
                                           : "",
                          affinity::format_plan(plan, topology)));
    }
    if (args.json) {
      nlohmann::json topo = affinity::to_json(topology);
      topo["gpus"] = gpu_json;
      print(nlohmann::json{{"topology", topo}, {"local_world_size", local_world}, {"ranks", ranks}}
                .dump(2) +
            "\n");
      return kExitOk;
    }
  }
  for (const auto& g : gpus)
    print(fmt::format("gpu: {} local CPUs {}\n", g.name, affinity::format_cpus(g.local_cpus)));
  if (gpus.empty()) print("gpu: none\n");
  return kExitOk;
}

} // namespace kdflow::app
