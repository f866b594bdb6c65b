// Reads cores, NUMA nodes, L3 groups and packages from hwloc, keeping only the allowed CPUs.
#include "kdflow/affinity/topology.hpp"

#include "hwloc_handle.hpp"
#include "kdflow/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace kdflow::affinity {
namespace {

void check(int status, const std::string& doing) {
  if (status != 0) throw std::runtime_error(fmt::format("hwloc: {} failed ({})", doing, status));
}

int logical_ancestor(hwloc_topology_t topo, hwloc_obj_t obj, hwloc_obj_type_t type) {
  hwloc_obj_t a = hwloc_get_ancestor_obj_by_type(topo, type, obj);
  return a == nullptr ? 0 : static_cast<int>(a->logical_index);
}

} // namespace

std::size_t cpu_count(const std::vector<CpuList>& lists) {
  std::size_t n = 0;
  for (const auto& cpus : lists) n += cpus.size();
  return n;
}

std::string format_cpus(const CpuList& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

Topology::Topology(std::unique_ptr<Handle> handle, std::string description)
    : handle_(std::move(handle)), description_(std::move(description)) {
  read_cores();
}
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

Topology Topology::load() {
  auto h = std::make_unique<Handle>();
  check(hwloc_topology_init(&h->topo), "topology init");
  // PCI devices are needed to find the cores near a GPU; the rest of I/O is not.
  hwloc_topology_set_io_types_filter(h->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  check(hwloc_topology_load(h->topo), "topology load");
  // Respect taskset as well as cgroups: restrict to the CPUs this process is bound to.
  Bitmap bound = make_bitmap();
  if (hwloc_get_cpubind(h->topo, bound.get(), HWLOC_CPUBIND_PROCESS) == 0 &&
      !hwloc_bitmap_iszero(bound.get()))
    check(hwloc_topology_restrict(h->topo, bound.get(), HWLOC_RESTRICT_FLAG_REMOVE_CPULESS),
          "restrict to the allowed CPUs");
  return Topology(std::move(h), "this machine");
}

Topology Topology::synthetic(const std::string& description) {
  // hwloc builds every object it is told of: a description of 10^9 PUs would take minutes and
  // gigabytes. Each level's count multiplies (the number after "type:").
  constexpr double kMaxPus = 1 << 16;
  double pus = 1;
  std::istringstream levels(description);
  for (std::string level; levels >> level;)
    if (const auto colon = level.find(':'); colon != std::string::npos)
      pus *= std::max(1.0, std::strtod(level.c_str() + colon + 1, nullptr));
  if (pus > kMaxPus)
    throw InputError(fmt::format("--synthetic '{}': {:.0f} PUs, more than a machine has (at most "
                                 "{:.0f})",
                                 description, pus, kMaxPus));
  auto h = std::make_unique<Handle>();
  h->synthetic = true;
  check(hwloc_topology_init(&h->topo), "topology init");
  if (hwloc_topology_set_synthetic(h->topo, description.c_str()) != 0)
    throw InputError(fmt::format("--synthetic '{}': not a valid hwloc synthetic topology (e.g. "
                                 "\"pack:2 numa:1 core:8 pu:2\")",
                                 description));
  check(hwloc_topology_load(h->topo), "synthetic topology load");
  return Topology(std::move(h), "synthetic: " + description);
}

void Topology::read_cores() {
  hwloc_topology_t t = handle_->topo;
  const hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(t);
  const int ncores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  for (int i = 0; i < ncores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    Bitmap pus = make_bitmap();
    hwloc_bitmap_and(pus.get(), core->cpuset, allowed);
    if (hwloc_bitmap_iszero(pus.get())) continue;
    Core c;
    c.index = static_cast<int>(cores_.size());
    c.pus = cpus_of(pus.get());
    c.l3 = logical_ancestor(t, core, HWLOC_OBJ_L3CACHE);
    c.package = logical_ancestor(t, core, HWLOC_OBJ_PACKAGE);
    // NUMA nodes hang off the memory side of the tree: the node whose cpuset holds this core.
    hwloc_obj_t node = nullptr;
    c.numa = 0;
    while ((node = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, node)) != nullptr)
      if (hwloc_bitmap_isincluded(core->cpuset, node->cpuset)) {
        c.numa = static_cast<int>(node->logical_index);
        break;
      }
    cores_.push_back(std::move(c));
  }
  packages_ = std::max(1, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE));
  numa_nodes_ = std::max(1, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE));
}

CpuList Topology::allowed_cpus() const {
  CpuList out;
  for (const auto& c : cores_) out.insert(out.end(), c.pus.begin(), c.pus.end());
  std::sort(out.begin(), out.end());
  return out;
}

CpuList Topology::numa_cpus(int numa) const {
  CpuList out;
  for (const auto& c : cores_)
    if (c.numa == numa) out.insert(out.end(), c.pus.begin(), c.pus.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<CpuList> Topology::pci_local_cpus(const std::string& bus_id) const {
  if (handle_->synthetic) return std::nullopt;
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(handle_->topo, bus_id.c_str());
  if (dev == nullptr) return std::nullopt;
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(handle_->topo, dev);
  if (anc == nullptr || anc->cpuset == nullptr) return std::nullopt;
  Bitmap local = make_bitmap();
  hwloc_bitmap_and(local.get(), anc->cpuset, hwloc_topology_get_allowed_cpuset(handle_->topo));
  if (hwloc_bitmap_iszero(local.get())) return std::nullopt;
  return cpus_of(local.get());
}

} // namespace kdflow::affinity
